//! The engine's shared state: what every handle, transaction and background task of
//! one open store works on. Below the public facade (`store.rs`) and above the
//! structures it ties together (WAL, segments, cache, catalog, trees).
//!
//! Concurrency model:
//! - One writer at a time (`Shared::writer`); readers take an immutable [`View`]
//!   (published roots) and never block, nor are blocked by, the writer.
//! - A committing writer appends its WAL record under the writer lock, releases it,
//!   and then waits for the group-commit fsync; its new roots are published to
//!   readers only after they are durable (for `Durability::Immediate`).
//! - Checkpoints take the writer lock only to freeze; they write while commits go on.
//!   Lock order: `writer` before `durable`.
//!
//! Poisoning: after an I/O error at a point where memory and disk may disagree (a WAL
//! write or sync, a checkpoint), [`Shared::poison`] latches the store: reads go on,
//! writes fail with `Poisoned` until it is reopened, and recovery restores the last
//! durable state.

mod apply;
mod lend;
mod view;

pub(crate) use apply::{
    apply_extent_run, apply_op, apply_record, create_version, drop_step, drop_version, Changes,
};
pub(crate) use lend::{Lender, LendingGuard};
pub(crate) use view::{View, ViewRegistry};

use crate::backref::{BackrefStore, WriteStore};
use crate::btree::cache::PageCache;
use crate::btree::node::Node;
use crate::btree::refcount::RefCounts;
use crate::btree::Loader;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::{Addr, AddrMap, BlockRef, Lsn};
use crate::io::{VFile, Vfs};
use crate::meta::{Chain, Meta};
use crate::options::Options;
use crate::space::{Segments, SpaceDelta};
use crate::superblock::Superblock;
use crate::sync::lock;
use crate::wal::Wal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// The writer's state: the newest roots (including commits not yet durable) and the
/// space bookkeeping of the current checkpoint interval.
pub(crate) struct WriterState {
    pub catalog: Catalog,
    /// Incremented by each checkpoint freeze; nodes made dirty carry it.
    pub epoch: u64,
    /// Live-byte changes since the last freeze.
    pub delta: SpaceDelta,
    /// Frozen nodes replaced since the last freeze (see `btree::write::shadow`).
    pub superseded: Vec<Arc<Node>>,
    /// Reference counts above one (see `btree::refcount`).
    pub refs: RefCounts,
    /// Written nodes of dropped versions that nothing references any more, waiting to
    /// be freed (their bytes) and to release their children ([`drop_step`]).
    pub drop_queue: Vec<BlockRef>,
    pub last_lsn: Lsn,
    /// Approximate bytes of nodes dirtied since the last freeze.
    pub dirty_bytes: u64,
    /// Back references ended since the last freeze (the checkpoint adds the ones its
    /// writes begin, and persists them as one run).
    pub backrefs: WriteStore,
    /// Written nodes copied while shared since `versions()` last looked: each copy gave
    /// their children one more parent. This is the only way a count rises below a
    /// written node (a clone raises only a root's own count), so it is all the
    /// invalidation `Shared::subtree_totals`' "one parent below" flag needs.
    pub unshared: Vec<Addr>,
    /// `unshared` passed [`UNSHARED_MAX`] and was not extended: nothing remembered
    /// about "one parent below" can be trusted.
    pub unshared_overflowed: bool,
}

/// The most addresses `WriterState::unshared` holds between two `versions()` calls.
pub(crate) const UNSHARED_MAX: usize = 1 << 20;

/// What a written subtree holds (`versions()`' memo): bytes of nodes and extents,
/// keys, and whether every block strictly below its top had a reference count of one
/// (then dropping the top frees all of it).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SubtreeTotals {
    pub bytes: u64,
    pub keys: u64,
    pub single: bool,
}

/// The durable state: what the newest superblock says. Guarded by the checkpoint lock.
pub(crate) struct Durable {
    pub sb: Superblock,
    /// The other slot's superblock, the one recovery falls back to if `sb`'s slot is
    /// damaged. Everything it needs is kept: WAL generations from its `wal_gen` on,
    /// and segments until a checkpoint after the one that emptied them.
    pub fallback: Option<Superblock>,
    pub sb_file: Arc<dyn VFile>,
    /// The metadata `sb` describes, rebuilt from its chain (roots by address). Each
    /// checkpoint computes its delta against it and folds the delta in.
    pub meta: Meta,
    /// The blobs of `sb`'s metadata chain.
    pub chain: Chain,
    /// The blobs of the fallback superblock's chain (often a prefix of `chain`).
    pub fallback_chain: Chain,
    /// The segments holding a blob of a back-reference run `meta`'s manifest names.
    pub run_segments: Vec<crate::format::SegmentId>,
    /// The same for the fallback superblock's manifest.
    pub fallback_run_segments: Vec<crate::format::SegmentId>,
    /// Addresses the last checkpoint recorded from in-memory counts: the next freeze
    /// re-records them from the table, where their counts may have changed or gone.
    pub recorded_from_mem: Vec<crate::format::Addr>,
    /// Bytes of the metadata blob the last checkpoint wrote (0 before the first).
    pub meta_bytes_last: u64,
    /// What a checkpoint that met a full disk while appending (its nodes, its
    /// back-reference run or its metadata blob) left for the next one
    /// (`checkpoint::put_off`): the next freeze takes it in before the interval's
    /// own changes.
    pub carried: Option<CarriedOver>,
}

/// The interval changes a put-off checkpoint had taken from the writer, plus what its
/// node writes added before the disk filled (all its nodes, if the disk filled at
/// the back-reference run or the metadata blob): the next checkpoint records them first,
/// as if the failed one had never frozen. The nodes it wrote keep their addresses
/// (garbage to a recovery, which never sees them referenced), and the nodes it did
/// not write stay dirty, so the next checkpoint's walk finds them.
pub(crate) struct CarriedOver {
    /// Reference-count changes, older than any the writer has made since.
    pub ref_changes: crate::btree::refcount::ChangeLog,
    /// The interval's space changes, plus the bytes of the nodes written.
    pub delta: SpaceDelta,
    /// The interval's back references, plus the edges of the nodes written; empty
    /// if the checkpoint appended its back-reference run before the disk filled
    /// (the store in memory holds that run, and the next manifest names it).
    pub backrefs: WriteStore,
    /// Bytes of the nodes the freeze found dirty (a bound on those still unwritten).
    pub dirty_bytes: u64,
}

impl Durable {
    /// Segments holding a blob either superblock slot reads at open: of its metadata
    /// chain, or of a back-reference run its manifest names. They are never deleted.
    pub(crate) fn meta_segments(&self) -> Vec<crate::format::SegmentId> {
        let mut s: Vec<_> = self
            .current_meta_segments()
            .into_iter()
            .chain(self.fallback_chain.segments())
            .chain(self.fallback_run_segments.iter().copied())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// As [`Durable::meta_segments`], for the newest slot only: the fallback's blobs
    /// stop holding a segment at the next checkpoint (the newest slot becomes the
    /// fallback).
    pub(crate) fn current_meta_segments(&self) -> Vec<crate::format::SegmentId> {
        let mut s: Vec<_> = self
            .chain
            .segments()
            .chain(self.run_segments.iter().copied())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }
}

/// What the background thread is asked to do.
#[derive(Default)]
pub(crate) struct BackgroundWork {
    pub stop: bool,
    /// A checkpoint threshold was crossed.
    pub checkpoint: bool,
    /// A drop left nodes to free.
    pub drops: bool,
}

/// The background thread's mailbox.
pub(crate) type Signal = (Mutex<BackgroundWork>, Condvar);

/// A segment a durable checkpoint emptied, waiting until nothing can reach it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingDelete {
    pub segment: crate::format::SegmentId,
    /// Views at an LSN below this may still reach the segment.
    pub lsn: Lsn,
    /// The superblock generation that emptied it: the fallback superblock may reach it
    /// until a later generation is durable.
    pub generation: u64,
}

impl PendingDelete {
    /// A pending deletion read from the durable metadata at open: no view of this
    /// process can be older than the state that emptied it.
    pub(crate) fn loaded(p: crate::meta::PendingSegment) -> PendingDelete {
        PendingDelete {
            segment: p.segment,
            lsn: Lsn(0),
            generation: p.generation,
        }
    }

    /// What the metadata persists of it.
    pub(crate) fn persisted(&self) -> crate::meta::PendingSegment {
        crate::meta::PendingSegment {
            segment: self.segment,
            generation: self.generation,
        }
    }
}

/// Everything one open store shares between its handles and threads.
pub(crate) struct Shared {
    pub label: String,
    pub path: PathBuf,
    pub opts: Options,
    pub vfs: Arc<dyn Vfs>,
    pub segments: Segments,
    /// The back references as of the durable checkpoint (the writer's `backrefs`
    /// holds what happened since). Taken after `durable` when both are needed.
    pub backrefs: Mutex<BackrefStore>,
    /// The next checkpoint merges every back-reference run into one (`shrink`).
    pub compact_backrefs: AtomicBool,
    /// Held by a run of the cleaner, `defrag` or `shrink`: one at a time. Two would
    /// undo each other's assumptions: one copies extents ahead into a segment that
    /// counts them as dead bytes, and the other may clean and delete that segment
    /// before the first commits its round.
    pub cleaning: Mutex<()>,
    /// Held while a write that found the disk full gives space back
    /// (`Store::make_room`): the others that found it full wait, then try again.
    pub making_room: Mutex<()>,
    /// Referenced bytes and keys of written branch subtrees (`versions()`): a written
    /// node never changes, so its totals hold as long as its address is in use.
    pub subtree_totals: Mutex<AddrMap<Addr, SubtreeTotals>>,
    pub cache: PageCache,
    pub wal: Wal,
    pub writer: Mutex<WriterState>,
    /// Lends the writer lock to version operations while the cleaner holds it.
    pub lender: Lender,
    pub durable: Mutex<Durable>,
    pub published: RwLock<Arc<View>>,
    pub views: Arc<ViewRegistry>,
    /// Segments emptied by a durable checkpoint, deletable once no view older than
    /// the LSN can reach them.
    pub pending_deletes: Mutex<Vec<PendingDelete>>,
    pub poisoned: Mutex<Option<String>>,
    pub background: Arc<Signal>,
    /// Mirrors `durable.sb.generation`, readable without waiting for a checkpoint.
    pub durable_generation: AtomicU64,
    /// Mirrors `durable.carried`'s `dirty_bytes` (0 when nothing is carried), for
    /// commits, which must not wait for the durable lock: the nodes a put-off
    /// checkpoint left unwritten are still dirty (`checkpoint_due`, and a large
    /// transaction does not commit by checkpoint while they wait).
    pub carried_dirty_bytes: AtomicU64,
    pub bg_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub closed: Mutex<bool>,
    /// The process lock on the store directory, held as long as the engine lives.
    pub _process_lock: Arc<dyn crate::io::StoreLock>,
}

impl Shared {
    pub(crate) fn loader(&self) -> Loader<'_> {
        Loader {
            cache: &self.cache,
            segments: &self.segments,
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.opts.read_only {
            return Err(Error::ReadOnly("the store was opened read-only".into()));
        }
        if let Some(why) = lock(&self.poisoned).as_ref() {
            return Err(Error::Poisoned(why.clone()));
        }
        Ok(())
    }

    /// Latches an I/O failure: memory and disk may now disagree, so no more writes.
    pub(crate) fn poison(&self, err: &Error) {
        let mut p = lock(&self.poisoned);
        if p.is_none() {
            *p = Some(err.to_string());
        }
        self.wal.poison(&err.to_string());
    }

    /// The writer lock, for a change that must be writable: checked before waiting
    /// for the lock and again once it is held (a checkpoint may have failed meanwhile).
    pub(crate) fn lock_writer_checked(&self) -> Result<MutexGuard<'_, WriterState>> {
        self.check_writable()?;
        let w = self.lock_writer();
        self.check_writable()?;
        Ok(w)
    }

    /// The writer lock. If a writer panicked while holding it (a broken invariant),
    /// the writer state may be half-changed: the store is poisoned, so it takes no
    /// more writes, and reopening recovers the last durable state.
    pub(crate) fn lock_writer(&self) -> MutexGuard<'_, WriterState> {
        match self.writer.lock() {
            Ok(w) => w,
            Err(poisoned) => {
                self.poison(&Error::InvalidArgument(
                    "an internal check failed while writing; reopen the store".into(),
                ));
                poisoned.into_inner()
            }
        }
    }

    /// A view of the writer's current roots at its last LSN.
    pub(crate) fn view_of(&self, w: &WriterState) -> Arc<View> {
        Arc::new(View::new(w.last_lsn, &w.catalog, self.views.clone()))
    }

    /// Keeps every block the writer's state reaches from being deleted while the
    /// result lives, without copying its roots (see [`View::holding`]).
    pub(crate) fn hold_space(&self, w: &WriterState) -> View {
        View::holding(w.last_lsn, self.views.clone())
    }

    /// Makes `view` what new readers see, unless a newer one is already published.
    pub(crate) fn publish(&self, view: Arc<View>) {
        self.replace_published(view, |new, old| new > old);
    }

    /// Replaces the published view by one of the same LSN (the same state, with roots
    /// named differently: by address instead of in memory).
    pub(crate) fn republish(&self, view: Arc<View>) {
        self.replace_published(view, |new, old| new == old);
    }

    /// Publishes `view` if `replaces(its LSN, the published one's)`. The view it
    /// replaces is dropped after the lock is let go: it may be the last holder of
    /// a whole tree of nodes (after a checkpoint, every node it wrote), and freeing
    /// them took 8 to 33 ms, which readers (and, in `unpin_written_roots`, writers)
    /// would otherwise wait for.
    fn replace_published(&self, view: Arc<View>, replaces: impl FnOnce(Lsn, Lsn) -> bool) {
        let mut p = self
            .published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = if replaces(view.lsn, p.lsn) {
            std::mem::replace(&mut *p, view)
        } else {
            view
        };
        drop(p);
        drop(old);
    }

    pub(crate) fn published(&self) -> Arc<View> {
        self.published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a checkpoint threshold has been crossed.
    pub(crate) fn checkpoint_due(&self, dirty_bytes: u64) -> bool {
        let carried = self.carried_dirty_bytes.load(Ordering::Relaxed);
        self.wal.bytes_since_checkpoint() > self.opts.checkpoint_wal_bytes
            || dirty_bytes + carried > self.opts.checkpoint_dirty_bytes
            || self.segments.data_since_fence() > self.segments.data_checkpoint_bytes()
    }

    /// Whether the data threshold (`Options::checkpoint_data_bytes`, less on a disk
    /// short of space) is crossed and the log's is not: a checkpoint due for the data
    /// appended alone.
    pub(crate) fn checkpoint_due_for_data_alone(&self) -> bool {
        self.segments.data_since_fence() > self.segments.data_checkpoint_bytes()
            && self.wal.bytes_since_checkpoint() <= self.opts.checkpoint_wal_bytes
    }

    /// The generation of the durable superblock.
    pub(crate) fn durable_generation(&self) -> u64 {
        self.durable_generation.load(Ordering::Relaxed)
    }

    /// Asks the background thread for work.
    pub(crate) fn signal(&self, ask: impl FnOnce(&mut BackgroundWork)) {
        let (m, cv) = &*self.background;
        ask(&mut lock(m));
        cv.notify_all();
    }

    /// Tells the background thread that dropped versions have nodes to free. Without
    /// one, they are freed by `finish_drops`, `checkpoint` and `close`.
    pub(crate) fn wake_background(&self) {
        self.signal(|work| work.drops = true);
    }

    /// Whether a put-off checkpoint left changes for the next one (`Durable::carried`).
    pub(crate) fn checkpoint_put_off(&self) -> bool {
        lock(&self.durable).carried.is_some()
    }

    /// Whether anything committed is not yet in a checkpoint.
    pub(crate) fn has_unwritten(&self) -> bool {
        // Not under the writer lock: a checkpoint writing holds `durable` for as long
        // as it writes, and every writer would wait with us.
        let (durable_lsn, carried) = {
            let d = lock(&self.durable);
            (d.sb.checkpoint_lsn, d.carried.is_some())
        };
        let w = self.lock_writer();
        carried || w.last_lsn > durable_lsn || !w.delta.is_empty()
    }
}
