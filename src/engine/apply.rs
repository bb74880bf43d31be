//! The write kernel: what every logged operation means, in one place.
//!
//! A live transaction, WAL replay and version creation all change the writer state
//! through these functions, so a record replayed after a crash does exactly what it
//! did when it was committed:
//! - [`apply_op`]: put, put-extent and delete on one tree;
//! - [`apply_record`]: a whole logged record (recovery);
//! - [`create_version`] and [`drop_version`]: the catalog changes;
//! - [`Changes`]: the bookkeeping an edit collects besides the tree (space, reference
//!   counts, superseded nodes, dirty bytes), built into a [`WriteCtx`] and folded into
//!   the writer state in one place.

use super::WriterState;
use crate::backref::WriteStore;
use crate::btree::node::{Child, Node, ValueRef};
use crate::btree::refcount::{CountUndo, RcDelta};
use crate::btree::{self, Loader, OldValue, WriteCtx};
use crate::catalog::{Version, VersionId, VersionKind};
use crate::error::{Error, Result};
use crate::format::{BlockRef, Lsn};
use crate::space::SpaceDelta;
use crate::wal::{Op, Record, VersionOp};
use std::sync::Arc;

/// What an edit changes besides the tree itself. A transaction keeps one for its
/// whole life and folds it in on commit (an abort drops it); a one-shot edit
/// ([`WriterState::edit`]) folds it in at once.
#[derive(Default)]
pub(crate) struct Changes {
    /// Live-byte changes.
    delta: SpaceDelta,
    /// The reference-count changes, applied as they were made: what an abort takes
    /// back ([`Changes::revert`]).
    undo: CountUndo,
    /// Frozen dirty nodes replaced or released; their addresses (assigned by the
    /// checkpoint in flight) are freed at the next freeze.
    superseded: Vec<Arc<Node>>,
    /// Bytes of nodes made dirty.
    dirtied_bytes: u64,
    /// Of those, bytes of copies of written nodes.
    copied_written_bytes: u64,
    /// Back references ended by the written nodes freed.
    backrefs: WriteStore,
    /// Written nodes copied while shared (see `WriterState::unshared`).
    unshared: Vec<crate::format::Addr>,
}

impl Changes {
    /// A write context over `w`'s committed counts that records into `self`.
    pub(crate) fn ctx<'a>(
        &'a mut self,
        w: &'a mut WriterState,
        loader: Loader<'a>,
    ) -> WriteCtx<'a> {
        WriteCtx {
            loader,
            epoch: w.epoch,
            delta: &mut self.delta,
            superseded: &mut self.superseded,
            dirtied_bytes: &mut self.dirtied_bytes,
            copied_written_bytes: &mut self.copied_written_bytes,
            refs: &mut w.refs,
            undo: &mut self.undo,
            backrefs: &mut self.backrefs,
            unshared: &mut self.unshared,
        }
    }

    /// Bytes of copies of written nodes made so far (see `WriteCtx`).
    pub(crate) fn copied_written_bytes(&self) -> u64 {
        self.copied_written_bytes
    }

    /// Bytes of nodes made dirty so far, copies and new ones (see `WriteCtx`).
    pub(crate) fn dirtied_bytes(&self) -> u64 {
        self.dirtied_bytes
    }

    /// Records nodes written before their transaction commits (a spill, `txn::spill`):
    /// the space they take and the back references they hold, both dropped with the
    /// rest of these changes if the transaction aborts.
    pub(crate) fn record_written(&mut self, written: SpaceDelta, edges: WriteStore) {
        self.delta.merge(written);
        self.backrefs.merge(edges);
    }

    /// Folds these changes into the writer state (the counts are in it already).
    pub(crate) fn merge_into(self, w: &mut WriterState) {
        w.delta.merge(self.delta);
        w.superseded.extend(self.superseded);
        w.dirty_bytes += self.dirtied_bytes;
        w.backrefs.merge(self.backrefs);
        if w.unshared.len() + self.unshared.len() <= super::UNSHARED_MAX {
            w.unshared.extend(self.unshared);
        } else {
            // Too many to track: `versions()` forgets every remembered flag instead.
            w.unshared_overflowed = true;
        }
    }

    /// Takes these changes back from the writer state: the counts they changed (the
    /// rest was never folded in). For a transaction that ends without committing.
    pub(crate) fn revert(mut self, w: &mut WriterState) {
        w.refs.revert(self.take_undo());
    }

    /// The record of the count changes made, for whoever may have to take them back
    /// once the rest of these changes is handed over (a commit's log append).
    pub(crate) fn take_undo(&mut self) -> CountUndo {
        std::mem::take(&mut self.undo)
    }
}

impl WriterState {
    /// Runs `f` with a write context and folds what it changed into this state, also
    /// when it fails half-way: each change an edit makes is complete in itself.
    pub(crate) fn edit<T>(
        &mut self,
        loader: Loader<'_>,
        f: impl FnOnce(&mut WriteCtx<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut changes = Changes::default();
        let result = f(&mut changes.ctx(self, loader));
        changes.merge_into(self);
        result
    }
}

/// Applies one operation to the tree at `root`: the meaning of put, put-extent and
/// delete. A value the operation replaces or removes loses its pointer (an extent no
/// other leaf shares is freed). Returns whether a value was replaced or removed.
pub(crate) fn apply_op(
    root: &mut Option<Child>,
    op: &Op<'_>,
    ctx: &mut WriteCtx<'_>,
) -> Result<bool> {
    let old = match *op {
        Op::Put { key, value } => btree::insert(root, key, ValueRef::Inline(value), ctx)?,
        Op::PutExtent { key, extent } => {
            // The extent was written (once) before the operation was logged; from
            // here on the tree holds it.
            ctx.delta.alloc(extent);
            btree::insert(root, key, ValueRef::Extent(extent), ctx)?
        }
        Op::Delete { key } => btree::delete(root, key, ctx)?,
    };
    if let Some(OldValue::Extent(r)) = old {
        ctx.release_value(ValueRef::Extent(r));
    }
    Ok(old.is_some())
}

/// [`apply_op`] of a `PutExtent` for each of `pairs`, whose keys strictly ascend, in
/// one pass down the tree for all the keys that share a leaf ([`btree::insert_run`]),
/// until `stop`: returns how many of `pairs` it applied (all, or at least one).
pub(crate) fn apply_extent_run(
    root: &mut Option<Child>,
    pairs: &[(&[u8], BlockRef)],
    ctx: &mut WriteCtx<'_>,
    stop: &dyn Fn() -> bool,
) -> Result<usize> {
    let run: Vec<(&[u8], ValueRef<'_>)> = pairs
        .iter()
        .map(|&(key, extent)| (key, ValueRef::Extent(extent)))
        .collect();
    // The values replaced are released once the run is in: the tree is borrowed
    // while it goes in, and each release stands alone (a count or a free), so the
    // order does not matter.
    let mut old_extents = Vec::new();
    let placed = btree::insert_run(
        root,
        &run,
        ctx,
        &mut |_, old| {
            if let OldValue::Extent(r) = old {
                old_extents.push(r);
            }
        },
        stop,
    );
    // (On an error the transaction fails whole: nothing is left to account.)
    let placed = placed?;
    for &(_, extent) in &pairs[..placed] {
        ctx.delta.alloc(extent);
    }
    for r in old_extents {
        ctx.release_value(ValueRef::Extent(r));
    }
    Ok(placed)
}

/// Replays one logged record into the writer state (recovery). `lsn` is the record's.
pub(crate) fn apply_record(
    w: &mut WriterState,
    loader: Loader<'_>,
    record: &Record<'_>,
    lsn: Lsn,
) -> Result<()> {
    match record {
        Record::Batch(batch) => {
            let id = VersionId(batch.branch());
            let version = w.catalog.by_id_mut(id).ok_or_else(|| {
                Error::corrupted("wal", format!("batch for unknown version {}", id.0))
            })?;
            if version.kind != VersionKind::Branch {
                return Err(Error::corrupted("wal", "batch for a read-only version"));
            }
            let mut root = version.root.take();
            let result = w.edit(loader, |ctx| {
                for op in batch.ops() {
                    apply_op(&mut root, &op?, ctx)?;
                }
                Ok(())
            });
            if let Some(v) = w.catalog.by_id_mut(id) {
                v.root = root;
            }
            result
        }
        Record::Version(op @ VersionOp::Create { .. }) => create_version(w, op, lsn),
        Record::Version(VersionOp::Drop { id }) => {
            if w.catalog.versions.iter().all(|v| v.id.0 != *id) {
                return Err(Error::corrupted(
                    "wal",
                    format!("drop of unknown version {id}"),
                ));
            }
            drop_version(w, loader, VersionId(*id));
            Ok(())
        }
        // The relocated blocks are where the superblock in use says they are.
        Record::Relocation { .. } => Ok(()),
        Record::CheckpointCommit { .. } => Err(Error::corrupted(
            "superblock",
            format!(
                "LSN {} was committed by a checkpoint newer than the superblock in use \
                 (the newest superblock slot is damaged); recovering would lose it",
                lsn.0
            ),
        )),
    }
}

/// Adds the version a `Create` record describes: its root is its source's root, which
/// gains a parent (Rodeh §5: the clone is O(1)), or no root for a new empty branch. The live path checks the name and
/// source before logging, so here a failure means a damaged log.
pub(crate) fn create_version(w: &mut WriterState, op: &VersionOp, lsn: Lsn) -> Result<()> {
    let VersionOp::Create {
        id,
        source,
        snapshot,
        created_unix_ms,
        created_checkpoint,
        name,
    } = op
    else {
        return Err(Error::corrupted(
            "wal",
            "a drop where a create was expected",
        ));
    };
    let root = match source {
        None => None,
        Some(source) => w
            .catalog
            .versions
            .iter()
            .find(|v| v.id.0 == *source)
            .ok_or_else(|| Error::corrupted("wal", format!("clone of unknown version {source}")))?
            .root
            .clone(),
    };
    if w.catalog.by_name(name).is_some() || w.catalog.versions.iter().any(|v| v.id.0 == *id) {
        return Err(Error::corrupted(
            "wal",
            format!("version {name:?} made twice"),
        ));
    }
    if let Some(root) = &root {
        let mut rc = RcDelta::default();
        rc.add(&w.refs.target(root), 1);
        w.refs.apply(rc);
    }
    w.catalog.versions.push(Version {
        id: VersionId(*id),
        name: name.as_str().into(),
        kind: if *snapshot {
            VersionKind::Snapshot
        } else {
            VersionKind::Branch
        },
        parent: source.map(VersionId),
        created_unix_ms: *created_unix_ms,
        created_lsn: lsn,
        created_checkpoint: *created_checkpoint,
        root,
    });
    w.catalog.next_id = w.catalog.next_id.max(id.saturating_add(1));
    Ok(())
}

/// Removes version `id` from the catalog and releases its root (Rodeh §5.4): nodes
/// with other parents lose one; in-memory nodes with none are released at once; written
/// ones go onto the drop queue for the background walk. Versions made from it are
/// re-linked to its parent, so the tree of versions stays connected.
pub(crate) fn drop_version(w: &mut WriterState, loader: Loader<'_>, id: VersionId) {
    let Some(at) = w.catalog.versions.iter().position(|v| v.id == id) else {
        return;
    };
    let gone = w.catalog.versions.remove(at);
    for v in &mut w.catalog.versions {
        if v.parent == Some(id) {
            v.parent = gone.parent;
        }
    }
    if let Some(root) = &gone.root {
        let mut queue: Vec<BlockRef> = Vec::new();
        // Releasing a root reads nothing (written nodes are queued, not loaded), so
        // this edit cannot fail.
        let _ = w.edit(loader, |ctx| {
            ctx.release_node(root.as_ref(), &mut queue);
            Ok(())
        });
        w.drop_queue.extend(queue);
    }
}

/// Frees up to `budget` queued nodes of dropped versions. Returns whether work remains.
pub(crate) fn drop_step(w: &mut WriterState, loader: Loader<'_>, budget: usize) -> Result<bool> {
    let mut queue = std::mem::take(&mut w.drop_queue);
    let result = w.edit(loader, |ctx| {
        for _ in 0..budget {
            let Some(r) = queue.pop() else { break };
            if let Err(e) = ctx.release_queued(r, &mut queue) {
                queue.push(r);
                return Err(e);
            }
        }
        Ok(())
    });
    w.drop_queue = queue;
    result.map(|()| !w.drop_queue.is_empty())
}
