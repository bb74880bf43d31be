//! Transactions: [`WriteTxn`] (an atomic batch of puts and deletes on one branch) and
//! [`ReadTxn`] (an immutable view of committed state), plus range iteration.
//!
//! Write transaction life cycle:
//! ```text
//! begin ──put/delete──▶ (ops applied to a private copy-on-write root)
//!   │                        │
//!   │ abort / drop           │ commit
//!   ▼                        ▼
//! root restored      small: WAL record appended under the writer lock → lock released
//!                           → fsync (group commit, Immediate only) → roots published
//!                    large (> LARGE_TXN_BYTES of ops, or past 16 MiB when that is
//!                           cheaper): no WAL record; a checkpoint under the writer
//!                           lock makes it durable → roots published
//! ```
//! A transaction whose own dirty nodes pass `Options::txn_dirty_bytes` becomes large
//! too, and writes them out at once ([`spill`]): its memory stays bounded whatever
//! its size.
//! A failure inside `put`/`delete` (an I/O or checksum error while reading the tree)
//! fails the whole transaction: `commit` then refuses and nothing of it is applied.

use crate::btree::cursor::{Cursor, Seek};
use crate::btree::node::{Child, ValueRef};
use crate::btree::{self, Loader, WriteCtx};
use crate::catalog::{VersionId, VersionKind};
use crate::checkpoint;
use crate::commit::{self, log_and_apply};
use crate::engine::{apply_extent_run, apply_op, Changes, Shared, View, WriterState};
use crate::error::{Error, Result};
use crate::format::BlockRef;
use crate::limits::{check_key, check_value, prefix_successor, INLINE_VALUE_MAX};
use crate::options::Durability;
use crate::space::checksum_refs;
use crate::wal::{BatchWriter, Op};
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, MutexGuard, OnceLock};

mod deferred;
mod spill;

pub(crate) use deferred::remove_stale_runs;
use deferred::{Deferred, Edit, EditRef};

/// A transaction whose logged operations pass this size commits by checkpoint
/// instead of through the WAL: its data is written once, into nodes, not twice.
///
/// Why so large (it was 16 MiB): a logged transaction leaves its dirty nodes in
/// memory for the next checkpoint, so the inserts of many transactions reach each leaf
/// before it is written; one that commits by checkpoint writes every leaf it touched at
/// once. A load of 3M keys in 200k-pair transactions (38 MiB of WAL each) took 34 s
/// when each transaction checkpointed (with the budgets of the time, 64 MiB of WAL and
/// 256 MiB of dirty nodes) and 10 s logged (BENCHMARKS.md). A quarter of the default
/// WAL budget, so several such transactions share a checkpoint.
pub(crate) const LARGE_TXN_BYTES: usize = 128 << 20;

/// Past this many bytes of operations (and below [`LARGE_TXN_BYTES`]), a transaction
/// commits by checkpoint if that is the cheaper way: when the nodes that checkpoint
/// would write (every dirty node, the earlier commits' and its own) weigh at most twice
/// its operations. Sorted input (an import) fills new leaves, so writing them now
/// costs about what logging would, and logging would write the same bytes a second
/// time at the next checkpoint; random inserts into a large tree dirty many times
/// their own size in leaves, which are better left dirty for later transactions to
/// add to.
const CHEAPER_BY_CHECKPOINT_BYTES: usize = 16 << 20;

/// An atomic batch of puts and deletes on one branch. Dropping it without `commit`
/// aborts it. One write transaction is open per store at a time.
pub struct WriteTxn<'s> {
    shared: &'s Shared,
    guard: Option<MutexGuard<'s, WriterState>>,
    version: VersionId,
    /// The working root, edited by this transaction.
    root: Option<Child>,
    /// The committed root this transaction started from, restored on abort. Holding it
    /// also keeps every node it reaches shared, so `shadow` copies rather than edits
    /// them in place.
    base: Option<Child>,
    /// Space, reference-count and dirty-node changes, folded in on commit.
    changes: Changes,
    /// The WAL record under construction; `None` once the transaction is large.
    batch: Option<BatchWriter>,
    ops: u32,
    durability: Durability,
    failed: Option<String>,
    /// `changes.copied_written_bytes()` at the last spill. What the transaction holds
    /// in memory since is about the copies of written nodes it made since, plus the
    /// entries it added since (`grown_bytes`); splits only move entries around.
    spilled_through: u64,
    /// Bytes of entries added since the last spill.
    grown_bytes: u64,
    /// Whether every key edited so far came after the one before (an import in key
    /// order), and the last of them while so.
    ascending: bool,
    last_key: Vec<u8>,
    /// The edits of a large transaction whose keys came out of order, applied at
    /// commit in key order (`deferred.rs`).
    deferred: Option<Deferred>,
}

impl std::fmt::Debug for WriteTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTxn")
            .field("version", &self.version.0)
            .field("ops", &self.ops)
            .finish_non_exhaustive()
    }
}

impl<'s> WriteTxn<'s> {
    pub(crate) fn begin(shared: &'s Shared, branch: &str) -> Result<WriteTxn<'s>> {
        let mut guard = shared.lock_writer_checked()?;
        let version = guard
            .catalog
            .by_name_mut(branch)
            .ok_or_else(|| Error::VersionNotFound(branch.to_owned()))?;
        if version.kind != VersionKind::Branch {
            return Err(Error::ReadOnly(format!("{branch:?} is a snapshot")));
        }
        let id = version.id;
        // Moved out, so the catalog does not hold a second reference to the root.
        let base = version.root.take();
        Ok(WriteTxn {
            shared,
            guard: Some(guard),
            version: id,
            root: base.clone(),
            base,
            changes: Changes::default(),
            batch: Some(BatchWriter::new(id.0)),
            ops: 0,
            durability: Durability::Immediate,
            failed: None,
            spilled_through: 0,
            grown_bytes: 0,
            ascending: true,
            last_key: Vec::new(),
            deferred: None,
        })
    }

    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::InvalidArgument(format!(
                "transaction failed earlier and must be aborted: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// The id of the version this transaction writes (see [`ReadTxn::version_id`]).
    pub fn version_id(&self) -> u32 {
        self.version.0
    }

    /// Sets when `commit` is durable (default: [`Durability::Immediate`]).
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = durability;
    }

    /// Inserts or replaces `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.check_usable()?;
        let op = if value.len() > INLINE_VALUE_MAX {
            // Written once, here, into its own extent; the WAL records only the reference.
            let extent = self
                .shared
                .segments
                .append_value(value)
                .inspect_err(|e| self.fail(e))?;
            Op::PutExtent { key, extent }
        } else {
            Op::Put { key, value }
        };
        self.edit(&op).map(drop)
    }

    /// Inserts or replaces several keys, in order (a later pair wins over an earlier
    /// one with the same key). The values over 1 KiB go to the segment in one write:
    /// for many large values at once (a volume's blocks) this saves a system call
    /// per value, and a large write goes to disk from another thread while this one
    /// updates the tree.
    pub fn put_many(&mut self, pairs: &[(&[u8], &[u8])]) -> Result<()> {
        self.put_many_from(pairs, None)
    }

    /// [`WriteTxn::put_many`] for values that lie back to back in `run`, in order (a
    /// volume write's blocks, slices of its payload): a large write then goes to disk
    /// straight from `run` when `run` is aligned for it, without being copied first.
    /// Pairs that are not laid out so are written as `put_many` writes them.
    pub(crate) fn put_many_from(
        &mut self,
        pairs: &[(&[u8], &[u8])],
        run: Option<&[u8]>,
    ) -> Result<()> {
        for &(key, value) in pairs {
            check_key(key)?;
            check_value(value)?;
        }
        self.check_usable()?;
        let large: Vec<&[u8]> = pairs
            .iter()
            .map(|&(_, v)| v)
            .filter(|v| v.len() > INLINE_VALUE_MAX)
            .collect();
        if large.is_empty() {
            return self.apply_puts(pairs, Vec::new());
        }
        let segments = &self.shared.segments;
        let mut staged = segments
            .stage_values_for_overlap(&large, run)
            .inspect_err(|e| self.fail(e))?;
        let mut extents = std::mem::take(&mut staged.refs);
        let (written, applied) = if staged.is_direct() {
            let deferred = staged.checksums_deferred();
            std::thread::scope(|scope| {
                let io = scope.spawn(|| segments.write_staged(staged));
                // The checksums while the extents go to disk.
                if deferred {
                    checksum_refs(&mut extents, &large);
                }
                let applied = self.apply_puts(pairs, extents);
                let written = io
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (written, applied)
            })
        } else {
            let written = segments.write_staged(staged);
            if written.is_err() {
                (written, Ok(()))
            } else {
                (written, self.apply_puts(pairs, extents))
            }
        };
        // The tree may name extents whose write failed: the transaction must not
        // commit.
        written.inspect_err(|e| self.fail(e))?;
        applied
    }

    /// Inserts or replaces each key with the value already written at its extent
    /// (`Segments::write_values_pinned`, before this transaction began), in order.
    #[cfg(test)]
    pub(crate) fn put_written(&mut self, pairs: &[(&[u8], BlockRef)]) -> Result<()> {
        self.put_written_until(pairs, &|| false).map(drop)
    }

    /// [`WriteTxn::put_written`] of `pairs` until `stop` says otherwise between two
    /// of them (a version operation waits for the writer lock): returns how many
    /// went in, the first of them at least.
    pub(crate) fn put_written_until(
        &mut self,
        pairs: &[(&[u8], BlockRef)],
        stop: &dyn Fn() -> bool,
    ) -> Result<usize> {
        for &(key, _) in pairs {
            check_key(key)?;
        }
        self.check_usable()?;
        let ascending = pairs.windows(2).all(|w| w[0].0 < w[1].0);
        if pairs.len() < 2 || !ascending || self.deferred.is_some() {
            for (i, &(key, extent)) in pairs.iter().enumerate() {
                if i > 0 && stop() {
                    return Ok(i);
                }
                self.edit(&Op::PutExtent { key, extent })?;
            }
            return Ok(pairs.len());
        }
        // A run in order (a volume's landing): one pass down the tree per leaf, and
        // what `edit` does besides for each, for all at once.
        let placed = self.apply_run(pairs, stop)?;
        let pairs = &pairs[..placed];
        if self.ascending {
            let (first, last) = (pairs[0].0, pairs[pairs.len() - 1].0);
            if first > self.last_key.as_slice() {
                self.last_key.clear();
                self.last_key.extend_from_slice(last);
            } else {
                self.ascending = false;
                self.last_key = Vec::new();
            }
        }
        for &(key, extent) in pairs {
            self.log(&Op::PutExtent { key, extent });
        }
        self.spill_if_due()?;
        Ok(placed)
    }

    /// `put_many`'s edits, with the large values already placed at `extents`.
    fn apply_puts(&mut self, pairs: &[(&[u8], &[u8])], extents: Vec<BlockRef>) -> Result<()> {
        let mut extents = extents.into_iter();
        for &(key, value) in pairs {
            let op = if value.len() > INLINE_VALUE_MAX {
                let extent = extents.next().expect("one extent per large value");
                Op::PutExtent { key, extent }
            } else {
                Op::Put { key, value }
            };
            self.edit(&op)?;
        }
        Ok(())
    }

    /// Deletes `key`; returns whether it was present.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.check_usable()?;
        self.edit(&Op::Delete { key })
    }

    /// Applies `op` to the tree, or defers it (`deferred.rs`) in a large transaction
    /// whose keys came out of order. Returns whether a value was replaced or removed
    /// (deferred puts report `true`).
    fn edit(&mut self, op: &Op<'_>) -> Result<bool> {
        let key = op_key(op);
        if self.deferred.is_some() {
            let edit = match *op {
                Op::Put { value, .. } => Edit::Put(value.into()),
                Op::PutExtent { extent, .. } => Edit::Extent(extent),
                Op::Delete { .. } => {
                    if !self.contains(key).inspect_err(|e| self.fail(e))? {
                        return Ok(false);
                    }
                    Edit::Delete
                }
            };
            self.ops += 1;
            let deferred = self.deferred.as_mut().expect("checked above");
            let pushed = deferred.push(key, edit);
            pushed.inspect_err(|e| self.fail(e))?;
            return Ok(true);
        }
        if self.ascending {
            if key > self.last_key.as_slice() {
                self.last_key.clear();
                self.last_key.extend_from_slice(key);
            } else {
                self.ascending = false;
                self.last_key = Vec::new();
            }
        }
        let changed = self.apply(op)?;
        if changed || !matches!(op, Op::Delete { .. }) {
            self.log(op);
        }
        self.spill_if_due()?;
        Ok(changed)
    }

    /// Whether `key` is there as this transaction sees it (no value is read).
    fn contains(&self, key: &[u8]) -> Result<bool> {
        match self.deferred_edit(key)? {
            Some(edit) => Ok(edit != Edit::Delete),
            None => {
                let found =
                    btree::get_with(self.shared.loader(), self.root.as_ref(), key, |_| Ok(()))?;
                Ok(found.is_some())
            }
        }
    }

    /// The newest deferred edit of `key`, if this transaction defers and has one.
    fn deferred_edit(&self, key: &[u8]) -> Result<Option<Edit>> {
        match &self.deferred {
            Some(d) => d.get(key),
            None => Ok(None),
        }
    }

    /// Reads `key` as this transaction sees it (its own writes included).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_with(key, <[u8]>::to_vec)
    }

    /// Runs `f` on the value of `key` as this transaction sees it, borrowed (see
    /// [`ReadTxn::get_with`]).
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        let loader = self.shared.loader();
        match self.deferred_edit(key)? {
            Some(Edit::Put(v)) => Ok(Some(f(&v))),
            Some(Edit::Extent(r)) => Ok(Some(f(&loader.extent(r)?))),
            Some(Edit::Delete) => Ok(None),
            None => get_borrowed(loader, self.root.as_ref(), key, f),
        }
    }

    /// Up to `limit` keys `k` with `start <= k < end`, in order, as this transaction
    /// sees them (its own writes included), never reading a value: what a range
    /// delete visits, so that it touches only keys that are there.
    pub fn keys_in(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>> {
        let loader = self.shared.loader();
        let mut keys = Vec::new();
        let mut cursor = Cursor::seek(loader, self.root.as_ref(), Seek::AtOrAfter(start, false))?;
        let Some(deferred) = &self.deferred else {
            while keys.len() < limit {
                match cursor.current() {
                    Some((key, _)) if key < end => keys.push(key.to_vec()),
                    _ => break,
                }
                cursor.advance(loader)?;
            }
            return Ok(keys);
        };
        // The tree and the deferred edits merged; on a key both have, the edit wins.
        let mut merge = deferred.merged_from(start)?;
        while keys.len() < limit {
            let in_tree = cursor.current().map(|(k, _)| k);
            let edited = merge.current();
            let (key, from_tree, from_edits) = match (in_tree, edited) {
                (None, None) => break,
                (Some(t), None) => (t, true, false),
                (None, Some((k, _))) => (k, false, true),
                (Some(t), Some((k, _))) => match t.cmp(k) {
                    std::cmp::Ordering::Less => (t, true, false),
                    std::cmp::Ordering::Equal => (k, true, true),
                    std::cmp::Ordering::Greater => (k, false, true),
                },
            };
            if key >= end {
                break;
            }
            let deleted = from_edits && matches!(merge.current(), Some((_, EditRef::Delete)));
            if !deleted {
                keys.push(key.to_vec());
            }
            if from_tree {
                cursor.advance(loader)?;
            }
            if from_edits {
                merge.advance()?;
            }
        }
        Ok(keys)
    }

    /// Applies `op` to the working root. Returns whether a value was replaced or
    /// removed. A failure fails the whole transaction.
    fn apply(&mut self, op: &Op<'_>) -> Result<bool> {
        self.edit_root(|root, ctx| apply_op(root, op, ctx))
    }

    /// [`WriteTxn::apply`] of a `PutExtent` for each of `pairs`, keys ascending, until
    /// `stop`; returns how many.
    fn apply_run(&mut self, pairs: &[(&[u8], BlockRef)], stop: &dyn Fn() -> bool) -> Result<usize> {
        self.edit_root(|root, ctx| apply_extent_run(root, pairs, ctx, stop))
    }

    /// Runs `f` on the working root with a write context over the writer state; a
    /// failure fails the whole transaction.
    fn edit_root<T>(
        &mut self,
        f: impl FnOnce(&mut Option<Child>, &mut WriteCtx<'_>) -> Result<T>,
    ) -> Result<T> {
        let w = self
            .guard
            .as_deref_mut()
            .expect("an open transaction holds the writer lock");
        let mut ctx = self.changes.ctx(w, self.shared.loader());
        let result = f(&mut self.root, &mut ctx);
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    /// Writes the transaction's dirty nodes out once they pass the budget. From then
    /// on it is large: it commits by checkpoint, which needs no WAL record naming its
    /// operations (a spilled node is only durable once a checkpoint references it). A
    /// failure fails the whole transaction.
    fn spill_if_due(&mut self) -> Result<()> {
        let dirty = self.changes.copied_written_bytes() - self.spilled_through + self.grown_bytes;
        if dirty <= self.shared.opts.txn_dirty_bytes {
            return Ok(());
        }
        self.batch = None;
        let w = self
            .guard
            .as_deref()
            .expect("an open transaction holds the writer lock");
        let spilled = spill::spill(self.shared, &w.refs, w.epoch, &mut self.root)
            .inspect_err(|e| self.fail(e))?;
        self.changes.record_written(spilled.written, spilled.edges);
        self.spilled_through = self.changes.copied_written_bytes();
        self.grown_bytes = 0;
        if !self.ascending && self.deferred.is_none() && self.failed.is_none() {
            // Out of order and larger than the budget: from here edits are sorted
            // before they reach the tree (`deferred.rs`).
            let budget = self.shared.opts.txn_dirty_bytes;
            self.deferred = Some(Deferred::new(Arc::clone(&self.shared.vfs), budget));
        }
        Ok(())
    }

    /// Applies the deferred edits to the tree, merged in key order (at commit).
    fn apply_deferred(&mut self, mut deferred: Deferred) -> Result<()> {
        deferred.finish().inspect_err(|e| self.fail(e))?;
        // Edits applied from here spill as any large transaction's do; they come in
        // key order, so a spill must not start deferring again (`spill_if_due`).
        self.ascending = true;
        let mut merge = deferred.merged_from(&[]).inspect_err(|e| self.fail(e))?;
        while let Some((key, edit)) = merge.current() {
            let op = match edit {
                EditRef::Put(value) => Op::Put { key, value },
                EditRef::Extent(extent) => Op::PutExtent { key, extent },
                EditRef::Delete => Op::Delete { key },
            };
            self.apply(&op)?;
            self.grown_bytes += op_bytes(&op);
            self.spill_if_due()?;
            merge.advance().inspect_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    fn fail(&mut self, e: &Error) {
        if self.failed.is_none() {
            self.failed = Some(e.to_string());
        }
    }

    fn log(&mut self, op: &Op<'_>) {
        self.ops += 1;
        self.grown_bytes += op_bytes(op);
        if let Some(batch) = &mut self.batch {
            batch.push(op);
            if batch.payload_len() > LARGE_TXN_BYTES {
                self.batch = None;
            }
        }
    }

    /// Commits: atomic, and durable on return under [`Durability::Immediate`].
    pub fn commit(self) -> Result<()> {
        let segments = &self.shared.segments;
        self.commit_inner()?;
        // Off the writer lock: the data stream's next segment, if it is due, so that
        // no later append creates one while holding the lock. A failure here is not
        // the commit's (it is durable); the roll will create the segment itself.
        let _ = segments.prepare_data_segment();
        Ok(())
    }

    fn commit_inner(mut self) -> Result<()> {
        self.check_usable()?;
        if let Some(deferred) = self.deferred.take() {
            self.apply_deferred(deferred)?;
        }
        let shared = self.shared;
        let mut guard = self
            .guard
            .take()
            .expect("an open transaction holds the writer lock");
        // Decided before the changes are taken apart below.
        let logged = self
            .batch
            .take()
            .filter(|b| !self.cheaper_by_checkpoint(&guard, b.payload_len()));
        // The committed root goes back first: if the commit fails before it installs
        // the new one, the branch is as it was.
        let version = self.version;
        set_root(&mut guard, version, self.base.take());
        let root = self.root.take();
        let mut changes = std::mem::take(&mut self.changes);
        if self.ops == 0 {
            // Nothing to log, but an Immediate commit still promises that everything
            // committed before it is durable (earlier Deferred commits included).
            changes.revert(&mut guard);
            let last = guard.last_lsn;
            drop(guard);
            if self.durability == Durability::Immediate {
                commit::sync_to(shared, last)?;
            }
            return Ok(());
        }
        match logged {
            Some(batch) => {
                // The counts changed as the edits were made: a failed append (which
                // leaves the log as it was) takes them back.
                let undo = changes.take_undo();
                let applied = log_and_apply(shared, &mut guard, &batch.record(), |w, _| {
                    set_root(w, version, root);
                    changes.merge_into(w);
                    Ok(())
                });
                match applied {
                    Ok(((), logged)) => {
                        drop(guard);
                        logged.publish(shared, self.durability)
                    }
                    Err(e) => {
                        guard.refs.revert(undo);
                        Err(e)
                    }
                }
            }
            None => {
                // Large: no WAL record; a checkpoint under the writer lock makes it
                // durable, so no later commit is logged on top of a state the log
                // does not contain.
                set_root(&mut guard, version, root);
                changes.merge_into(&mut guard);
                guard.last_lsn = guard.last_lsn.next();
                checkpoint::run(shared, Some(&mut guard))?;
                shared.publish(shared.view_of(&guard));
                Ok(())
            }
        }
    }

    /// Discards the transaction.
    pub fn abort(self) {}

    /// Whether committing by checkpoint costs less than logging `logged` bytes of
    /// operations (see [`CHEAPER_BY_CHECKPOINT_BYTES`]); `w` is the writer state.
    /// Never while a put-off checkpoint's nodes wait to be written: this checkpoint
    /// would write them too, without first checking for room, and one that a full
    /// disk stops here poisons the store (it has no log record to fall back on).
    fn cheaper_by_checkpoint(&self, w: &WriterState, logged: usize) -> bool {
        let carried = &self.shared.carried_dirty_bytes;
        if carried.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return false;
        }
        let to_write = w.dirty_bytes + self.changes.dirtied_bytes() + self.grown_bytes;
        logged > CHEAPER_BY_CHECKPOINT_BYTES && to_write <= 2 * logged as u64
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            // Aborted: put the branch's committed root back, and the reference counts
            // its edits changed. Extents this transaction wrote stay unreferenced,
            // dead bytes in their segment.
            set_root(&mut guard, self.version, self.base.take());
            std::mem::take(&mut self.changes).revert(&mut guard);
        }
    }
}

/// About the bytes `op` adds to a leaf: its key, its inline value or extent
/// reference, and the entry's framing.
fn op_bytes(op: &Op<'_>) -> u64 {
    let bytes = match *op {
        Op::Put { key, value } => key.len() + value.len() + 8,
        Op::PutExtent { key, .. } => key.len() + 24,
        Op::Delete { .. } => 0,
    };
    bytes as u64
}

/// The key `op` edits.
fn op_key<'k>(op: &Op<'k>) -> &'k [u8] {
    match *op {
        Op::Put { key, .. } | Op::PutExtent { key, .. } | Op::Delete { key } => key,
    }
}

/// Sets the root of branch `id`, which an open transaction keeps in the catalog.
fn set_root(w: &mut WriterState, id: VersionId, root: Option<Child>) {
    if let Some(v) = w.catalog.by_id_mut(id) {
        v.root = root;
    }
}

/// A point lookup that lends the value to `f`.
fn get_borrowed<R>(
    loader: Loader<'_>,
    root: Option<&Child>,
    key: &[u8],
    f: impl FnOnce(&[u8]) -> R,
) -> Result<Option<R>> {
    btree::get_with(loader, root, key, |v| match v {
        ValueRef::Inline(bytes) => Ok(f(bytes)),
        ValueRef::Extent(r) => Ok(f(&loader.extent(r)?)),
    })
}

/// A consistent, immutable view of one version's committed state. Cheap to clone;
/// never blocks writers and is never blocked by them.
#[derive(Clone)]
pub struct ReadTxn {
    shared: Arc<Shared>,
    view: Arc<View>,
    version: VersionId,
    root: Option<Child>,
    /// The root node, once a lookup has loaded it: held for the transaction's life,
    /// so that lookups need not find it in the page cache each time.
    root_node: OnceLock<Child>,
}

impl std::fmt::Debug for ReadTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadTxn")
            .field("lsn", &self.view.lsn.0)
            .finish_non_exhaustive()
    }
}

type Pair = (Vec<u8>, Vec<u8>);

impl ReadTxn {
    pub(crate) fn new(shared: Arc<Shared>, view: Arc<View>, version: &str) -> Result<ReadTxn> {
        let v = view
            .version(version)
            .ok_or_else(|| Error::VersionNotFound(version.to_owned()))?;
        let (id, root) = (v.id, v.root.clone());
        Ok(ReadTxn {
            shared,
            view,
            version: id,
            root,
            root_node: OnceLock::new(),
        })
    }

    fn loader(&self) -> Loader<'_> {
        self.shared.loader()
    }

    /// The root to start a lookup at: in memory once loaded (a failed load is the
    /// lookup's error, and the next lookup tries again).
    fn root(&self) -> Result<Option<&Child>> {
        match &self.root {
            Some(Child::Disk(r)) => {
                if let Some(node) = self.root_node.get() {
                    return Ok(Some(node));
                }
                let node = Child::Mem(self.loader().load(*r)?);
                Ok(Some(self.root_node.get_or_init(|| node)))
            }
            other => Ok(other.as_ref()),
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let loader = self.loader();
        btree::get_with(loader, self.root()?, key, |v| loader.value(v))
    }

    /// Runs `f` on the value of `key`, if present, borrowed: an inline value straight
    /// from the cached node, with nothing allocated or copied (an out-of-line value is
    /// read first). The borrowing form of [`ReadTxn::get`].
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = cambium::Store::create(dir.path())?;
    /// store.put(b"k", b"value")?;
    /// let len = store.read()?.get_with(b"k", |v| v.len())?;
    /// assert_eq!(len, Some(5));
    /// # Ok::<(), cambium::Error>(())
    /// ```
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        let loader = self.loader();
        btree::get_with(loader, self.root()?, key, |v| match v {
            ValueRef::Inline(bytes) => Ok(f(bytes)),
            ValueRef::Extent(r) => Ok(f(&loader.extent(r)?)),
        })
    }

    /// Whether `key` is present (never reads an out-of-line value).
    pub fn contains_key(&self, key: &[u8]) -> Result<bool> {
        btree::contains(self.loader(), self.root()?, key)
    }

    /// The pairs whose keys fall in `range`, in key order (`.rev()` for reverse).
    pub fn range<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Result<Iter> {
        let lower = range.start_bound().map(|k| k.to_vec());
        let upper = range.end_bound().map(|k| k.to_vec());
        Ok(Iter::new(self, lower, upper))
    }

    /// Every pair whose key starts with `prefix`.
    pub fn prefix(&self, prefix: &[u8]) -> Result<Iter> {
        let upper = match prefix_successor(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        Ok(Iter::new(self, Bound::Included(prefix.to_vec()), upper))
    }

    /// Every pair, in key order.
    pub fn iter(&self) -> Result<Iter> {
        Ok(Iter::new(self, Bound::Unbounded, Bound::Unbounded))
    }

    /// The pair with the smallest key.
    pub fn first(&self) -> Result<Option<Pair>> {
        self.iter()?.next().transpose()
    }

    /// The pair with the largest key.
    pub fn last(&self) -> Result<Option<Pair>> {
        self.iter()?.next_back().transpose()
    }

    /// How many keys fall in `range` (reads keys only).
    pub fn count<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Result<u64> {
        let mut n = 0;
        for k in self.range(range)?.keys() {
            k?;
            n += 1;
        }
        Ok(n)
    }

    /// The commit sequence number this view reflects.
    pub fn lsn(&self) -> u64 {
        self.view.lsn.0
    }

    /// The id of the version this view reads (the `id` that `Store::versions`
    /// lists): a name may be dropped and given to a new version, an id never is.
    pub fn version_id(&self) -> u32 {
        self.version.0
    }
}

/// An iterator over a key range of a [`ReadTxn`], from either end.
///
/// As an [`Iterator`] it yields owned `(key, value)` pairs. [`Iter::next_ref`] and
/// [`Iter::next_back_ref`] yield the same entries borrowed instead: the key and an
/// inline value are slices of the cached node, so a scan copies nothing it does not
/// keep. The two styles may be mixed on one iterator.
pub struct Iter {
    shared: Arc<Shared>,
    _view: Arc<View>,
    root: Option<Child>,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    front: Option<Cursor>,
    back: Option<Cursor>,
    /// An out-of-line value read for `next_ref`, which lends it out.
    extent_buf: Vec<u8>,
    keys_only: bool,
    done: bool,
}

impl std::fmt::Debug for Iter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn above(key: &[u8], upper: &Bound<Vec<u8>>) -> bool {
    match upper {
        Bound::Included(u) => key > u.as_slice(),
        Bound::Excluded(u) => key >= u.as_slice(),
        Bound::Unbounded => false,
    }
}

fn below(key: &[u8], lower: &Bound<Vec<u8>>) -> bool {
    match lower {
        Bound::Included(l) => key < l.as_slice(),
        Bound::Excluded(l) => key <= l.as_slice(),
        Bound::Unbounded => false,
    }
}

impl Iter {
    fn new(txn: &ReadTxn, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Iter {
        Iter {
            shared: txn.shared.clone(),
            _view: txn.view.clone(),
            // The root in memory, so that a seek need not find it in the page cache;
            // if it cannot be loaded, by address: the iteration reports the error.
            root: match txn.root() {
                Ok(root) => root.cloned(),
                Err(_) => txn.root.clone(),
            },
            lower,
            upper,
            front: None,
            back: None,
            extent_buf: Vec::new(),
            keys_only: false,
            done: false,
        }
    }

    /// Keys only: out-of-line values are never read.
    pub fn keys(mut self) -> Keys {
        self.keys_only = true;
        Keys(self)
    }

    /// The next entry from the front, borrowed: the key, and the value (an inline
    /// value straight from the cached node; an out-of-line one from a buffer the
    /// iterator reuses). Valid until the iterator moves again.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = cambium::Store::create(dir.path())?;
    /// store.put(b"a", b"1")?;
    /// store.put(b"b", b"2")?;
    /// let mut iter = store.read()?.iter()?;
    /// let mut total = 0;
    /// while let Some(entry) = iter.next_ref() {
    ///     let (key, value) = entry?;
    ///     total += key.len() + value.len();
    /// }
    /// assert_eq!(total, 4);
    /// # Ok::<(), cambium::Error>(())
    /// ```
    #[allow(
        clippy::should_implement_trait,
        reason = "a lending iterator, not Iterator"
    )]
    pub fn next_ref(&mut self) -> Option<Result<(&[u8], &[u8])>> {
        self.next_ref_from(true)
    }

    /// The next entry from the back, borrowed (see [`Iter::next_ref`]).
    pub fn next_back_ref(&mut self) -> Option<Result<(&[u8], &[u8])>> {
        self.next_ref_from(false)
    }

    /// Moves one end to its next entry; `false` when the range is exhausted (the end
    /// passed the bound, or met the other end).
    fn step(&mut self, forward: bool) -> Result<bool> {
        let loader = Loader {
            cache: &self.shared.cache,
            segments: &self.shared.segments,
        };
        let (cursor, other) = if forward {
            (&mut self.front, &self.back)
        } else {
            (&mut self.back, &self.front)
        };
        match cursor {
            None => {
                let seek = if forward {
                    match &self.lower {
                        Bound::Unbounded => Seek::First,
                        Bound::Included(k) => Seek::AtOrAfter(k, false),
                        Bound::Excluded(k) => Seek::AtOrAfter(k, true),
                    }
                } else {
                    match &self.upper {
                        Bound::Unbounded => Seek::Last,
                        Bound::Included(k) => Seek::AtOrBefore(k, false),
                        Bound::Excluded(k) => Seek::AtOrBefore(k, true),
                    }
                };
                *cursor = Some(Cursor::seek(loader, self.root.as_ref(), seek)?);
            }
            Some(c) if forward => c.advance(loader)?,
            Some(c) => c.retreat(loader)?,
        }
        let c = cursor.as_ref().expect("set above");
        let Some((key, _)) = c.current() else {
            return Ok(false);
        };
        // The other end, if it has started, sits on the last entry it yielded (a
        // cursor only moves past an entry it does not yield when the iteration ends):
        // the two ends stop where they meet.
        let met = other.as_ref().and_then(Cursor::current).map(|(k, _)| k);
        let out_of_range = if forward {
            above(key, &self.upper) || met.is_some_and(|b| key >= b)
        } else {
            below(key, &self.lower) || met.is_some_and(|f| key <= f)
        };
        Ok(!out_of_range)
    }

    /// Steps one end, turning the end of the range or an error into the iterator's end.
    fn advance_end(&mut self, forward: bool) -> Option<Result<()>> {
        if self.done {
            return None;
        }
        match self.step(forward) {
            Ok(true) => Some(Ok(())),
            Ok(false) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    /// The next key from the front with the length of its value, which is not
    /// read (an out-of-line value's length is in its reference).
    pub(crate) fn next_key_and_len(&mut self) -> Option<Result<(&[u8], usize)>> {
        if let Err(e) = self.advance_end(true)? {
            return Some(Err(e));
        }
        let (key, value) = self.front.as_ref()?.current()?;
        let len = match value {
            ValueRef::Inline(v) => v.len(),
            ValueRef::Extent(r) => r.len as usize,
        };
        Some(Ok((key, len)))
    }

    fn next_ref_from(&mut self, forward: bool) -> Option<Result<(&[u8], &[u8])>> {
        if let Err(e) = self.advance_end(forward)? {
            return Some(Err(e));
        }
        let Iter {
            shared,
            front,
            back,
            extent_buf,
            keys_only,
            done,
            ..
        } = self;
        let cursor = if forward { &*front } else { &*back };
        let (key, value) = cursor
            .as_ref()
            .and_then(Cursor::current)
            .expect("step stopped on an entry");
        let value: &[u8] = match value {
            _ if *keys_only => &[],
            ValueRef::Inline(v) => v,
            ValueRef::Extent(r) => match shared.loader().extent(r) {
                Ok(bytes) => {
                    *extent_buf = bytes;
                    extent_buf
                }
                Err(e) => {
                    *done = true;
                    return Some(Err(e));
                }
            },
        };
        Some(Ok((key, value)))
    }

    fn next_from(&mut self, forward: bool) -> Option<Result<Pair>> {
        self.next_ref_from(forward)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }
}

impl Iterator for Iter {
    type Item = Result<Pair>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_from(true)
    }
}

impl DoubleEndedIterator for Iter {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_from(false)
    }
}

/// Keys of a range, without their values.
#[derive(Debug)]
pub struct Keys(Iter);

impl Keys {
    /// The next key from the front, borrowed from the cached node (see
    /// [`Iter::next_ref`]).
    #[allow(
        clippy::should_implement_trait,
        reason = "a lending iterator, not Iterator"
    )]
    pub fn next_ref(&mut self) -> Option<Result<&[u8]>> {
        self.0.next_ref().map(|r| r.map(|(k, _)| k))
    }

    /// The next key from the back, borrowed.
    pub fn next_back_ref(&mut self) -> Option<Result<&[u8]>> {
        self.0.next_back_ref().map(|r| r.map(|(k, _)| k))
    }
}

impl Iterator for Keys {
    type Item = Result<Vec<u8>>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|r| r.map(|(k, _)| k))
    }
}

impl DoubleEndedIterator for Keys {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|r| r.map(|(k, _)| k))
    }
}
