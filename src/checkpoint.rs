//! The checkpoint: the IBT flush (paper 004, algorithm 1) plus the two-phase commit of
//! the superblock.
//!
//! 1. Freeze (under the writer lock, briefly): take the writer's roots and the space
//!    delta of the interval, bump the epoch so later writes copy frozen nodes instead
//!    of editing them, and rotate the WAL so later commits go to the next generation.
//! 2. Write, while commits go on: collect the dirty nodes reachable from the frozen
//!    roots into one list per level, then write the levels bottom-up, leaves first,
//!    each node exactly once, packed into large sequential appends. A node's new
//!    address lands in the node itself (`disk`), where its dirty parent, written in the
//!    next level, picks it up.
//! 3. Write one metadata blob: a delta of what changed since the previous checkpoint
//!    (catalog entries, live bytes, reference counts, drop queue, pending deletions),
//!    linked to the durable chain, or a new base when the chain has outgrown its base
//!    (`meta`). Fsync the segments, then write the superblock into the other slot and
//!    fsync it. The checkpoint is durable now and not before.
//! 4. After: the WAL generations it covers are deleted; segments it emptied (recorded
//!    as pending in its own metadata) are deleted once a later checkpoint is durable,
//!    no reader view can reach them and no blob of either slot's metadata chain or
//!    back-reference runs is in them.
//!    Space freed in this interval is reused only now, after the checkpoint that
//!    frees it is durable.
//!
//! Crash analysis: before step 3's superblock fsync, recovery uses the previous
//! superblock and replays both WAL generations (the rotated one is written at the
//! freeze and fsynced by the next group commit, before any record of the new one:
//! `Wal::rotate`); the nodes written so far are unreferenced garbage in a segment. A torn
//! superblock slot fails its checksum and the other slot is used. After it, the new
//! superblock is used and replays from the new generation.

use crate::backref::WriteStore;
use crate::btree::node::{Child, Node};
use crate::btree::refcount::ChangeLog;
use crate::btree::walk::{walk, At, Visitor};
use crate::btree::{end_backrefs, node_children};
use crate::catalog::Catalog;
use crate::engine::{Durable, LendingGuard, PendingDelete, Shared, WriterState};
use crate::error::Result;
use crate::format::{crc, len_u32, Addr, BlockRef, Lsn, SegmentId};
use crate::meta::{self, Chain, MetaDelta, PendingSegment};
use crate::space::{AppendFence, SpaceDelta};
use crate::superblock::{Superblock, SuperblockFile};
use crate::sync::lock;
use crate::wal;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, MutexGuard, TryLockError};

/// Appends are issued in chunks of about this size: large enough to be sequential
/// bandwidth, small enough not to double a big checkpoint's memory.
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// What a freeze captured.
struct Frozen {
    /// The epoch whose dirty nodes this checkpoint writes.
    epoch: u64,
    catalog: Catalog,
    /// Reference counts of written blocks changed since the previous freeze, with
    /// their counts as of this one (1: the entry is gone). Never the whole table.
    ref_changes: ChangeLog,
    /// Counts of in-memory nodes (all of the frozen epoch), recorded by address once
    /// they are written.
    unmerged: Vec<(Arc<Node>, u32)>,
    drop_queue: Vec<BlockRef>,
    lsn: Lsn,
    delta: SpaceDelta,
    next_wal_gen: u64,
    /// The segments appends may reach after the freeze: none of them is deleted on
    /// this checkpoint's account.
    append_fence: AppendFence,
    /// Back references the interval ended; the nodes this checkpoint writes add theirs.
    backrefs: WriteStore,
    /// Nodes replaced while the previous checkpoint was writing them, which this
    /// interval frees ([`Frozen::free_superseded`]).
    superseded: Vec<Arc<Node>>,
    /// The LSN of a large transaction this checkpoint commits, which has no record
    /// in the log (`lsn` then; the log's last LSN is the one before).
    unlogged: Option<Lsn>,
    /// Bytes of the nodes dirty at the freeze.
    dirty_bytes: u64,
    /// What a put-off checkpoint left: taken in by `write`, before this interval's
    /// changes (off the writer lock).
    carried: Option<crate::engine::CarriedOver>,
}

impl Frozen {
    /// Frees the nodes replaced while the previous checkpoint was writing them: it
    /// has finished (checkpoints are serialised by the durable lock), so they have
    /// addresses now. Off the writer lock: these are often the last holders of
    /// whole subtrees the writer has replaced since, and freeing them held the lock
    /// 1.6–4.8 ms at a freeze (a snapshot asked for meanwhile waited as long).
    fn free_superseded(&mut self, shared: &Shared, put_off_before: bool) {
        for node in std::mem::take(&mut self.superseded) {
            // Unwritten: a put-off checkpoint did not reach it, and nothing holds it.
            let Some(&r) = node.disk.get() else {
                debug_assert!(
                    put_off_before,
                    "a durable checkpoint writes every frozen node"
                );
                continue;
            };
            self.delta.free(r);
            end_backrefs(&mut self.backrefs, r);
            // The checkpoint cached it as it wrote it; nothing live names it now.
            shared.cache.remove(r.addr);
        }
    }

    /// Puts a put-off checkpoint's changes before this interval's: they happened
    /// first.
    fn take_in_carried(&mut self) {
        let Some(earlier) = self.carried.take() else {
            return;
        };
        self.ref_changes.after(earlier.ref_changes);
        self.delta.merge(earlier.delta);
        let later = std::mem::replace(&mut self.backrefs, earlier.backrefs);
        self.backrefs.merge(later);
        self.dirty_bytes += earlier.dirty_bytes;
    }
}

/// Runs a checkpoint. `held` is the writer state when the caller already holds the
/// writer lock (a large transaction committing by checkpoint); otherwise the lock is
/// taken just for the freeze.
pub(crate) fn run(shared: &Shared, held: Option<&mut WriterState>) -> Result<()> {
    let epoch = match held {
        Some(w) => run_holding(shared, w)?,
        None => {
            let mut w = shared.lock_writer();
            let mut durable = lock(&shared.durable);
            let frozen = freeze(shared, &mut w, &mut durable).inspect_err(|e| shared.poison(e));
            drop(w);
            write(shared, &mut durable, frozen?)?
        }
    };
    after_durable(shared, epoch);
    Ok(())
}

/// [`run`] as when its end found the writer lock taken: the nodes it wrote keep
/// their counts in memory (`unpin_written_roots` only tries the lock).
#[cfg(test)]
pub(crate) fn run_leaving_counts_unfolded(shared: &Shared) -> Result<()> {
    let mut w = shared.lock_writer();
    let mut durable = lock(&shared.durable);
    let frozen = freeze(shared, &mut w, &mut durable)?;
    drop(w);
    write(shared, &mut durable, frozen).map(drop)
}

/// Runs a checkpoint while the caller holds the writer lock, as [`run`] does, but
/// leaves what follows a durable checkpoint (deleting the segments it made
/// unreachable, unpinning written roots) to the caller, to do after it lets the lock
/// go: deleting a large file can take longer than the checkpoint itself, and commits
/// are waiting meanwhile. Returns the epoch it wrote.
pub(crate) fn run_holding(shared: &Shared, w: &mut WriterState) -> Result<u64> {
    let mut durable = lock(&shared.durable);
    let frozen = freeze(shared, w, &mut durable).inspect_err(|e| shared.poison(e))?;
    let epoch = write(shared, &mut durable, frozen)?;
    w.refs.merge_written(epoch);
    Ok(epoch)
}

/// [`run_holding`] for a holder that lends the writer lock: the write after the
/// freeze runs on a scoped thread while this one serves version operations (the
/// writer state is the next interval's by then, as when a background checkpoint
/// writes beside commits). Waiting for a checkpoint already writing lends too.
pub(crate) fn run_lending(shared: &Shared, w: &mut LendingGuard<'_>) -> Result<u64> {
    let mut durable = lock_durable_lending(shared, w);
    let frozen = freeze(shared, w, &mut durable).inspect_err(|e| shared.poison(e))?;
    let durable: &mut Durable = &mut durable;
    // The write runs on another thread: a caller that may use the reserve (a clean on
    // a full disk) lets it too.
    let allowed = crate::io::reserve_allowed_here();
    let epoch = w.serve_while(|| {
        let _allowed = allowed.then(crate::io::allow_reserve);
        write(shared, durable, frozen)
    })?;
    w.refs.merge_written(epoch);
    Ok(epoch)
}

/// The durable state, for a holder that lends the writer lock: lends it while a
/// checkpoint already writing holds `durable`.
pub(crate) fn lock_durable_lending<'s>(
    shared: &'s Shared,
    w: &mut LendingGuard<'_>,
) -> MutexGuard<'s, Durable> {
    loop {
        match shared.durable.try_lock() {
            Ok(durable) => return durable,
            Err(TryLockError::Poisoned(p)) => return p.into_inner(),
            Err(TryLockError::WouldBlock) => w.serve_while(|| drop(lock(&shared.durable))),
        }
    }
}

/// Whether a checkpoint now would have nothing to write: no commit, free, drop or
/// back reference since the durable one, nothing a put-off checkpoint left, and
/// nothing in memory unwritten.
pub(crate) fn nothing_to_write(durable: &Durable, w: &WriterState) -> bool {
    w.last_lsn == durable.sb.checkpoint_lsn
        && durable.carried.is_none()
        && w.dirty_bytes == 0
        && w.delta.is_empty()
        && w.superseded.is_empty()
        && w.drop_queue.is_empty()
        && w.backrefs.is_empty()
}

/// Asks for a checkpoint: wakes the background thread, or runs one here when the
/// store runs without one (and the disk has room for it: [`has_room`]).
pub(crate) fn request(shared: &Shared) -> Result<()> {
    if shared.opts.background_checkpoints {
        shared.signal(|work| work.checkpoint = true);
        Ok(())
    } else if has_room(shared) {
        run(shared, None)
    } else {
        Ok(())
    }
}

/// Whether a checkpoint that is not required now may run: always on a thread that
/// may use the reserve; otherwise only with at least the reserve's size free
/// (`Segments::room_for_metadata`). A checkpoint that meets a full disk is put off
/// having spent the reserve and written nodes for nothing (and one committing a large
/// transaction poisons the store), so on a disk another process filled, a checkpoint
/// the store could put off (an interval's, a close's) waits for room instead of
/// running into the full disk: the commits stay in the log meanwhile, and the store
/// writable. (A server whose disk filled for a moment used to be stuck until it was
/// restarted.) One that began with room and meets a disk filled meanwhile finishes
/// on the reserve (`write`).
pub(crate) fn has_room(shared: &Shared) -> bool {
    crate::io::reserve_allowed_here() || shared.segments.room_for_metadata()
}

fn freeze(shared: &Shared, w: &mut WriterState, durable: &mut Durable) -> Result<Frozen> {
    shared.check_writable()?;
    // The previous checkpoint (of epoch - 1) has finished: fold the counts of the
    // nodes it wrote into the table by address. Not if it was put off: some nodes of
    // its epoch are still unwritten, and `merged_through` may pass an epoch only once
    // all of its written nodes are folded, so the next durable checkpoint folds them.
    let carried = durable.carried.take();
    if carried.is_none() {
        w.refs.merge_written(w.epoch - 1);
    }
    // It recorded those nodes' counts as they were at its freeze; record them again
    // as they are now (changed, or gone, since).
    for addr in durable.recorded_from_mem.drain(..) {
        w.refs.mark_changed(addr);
    }
    let append_fence = shared.segments.fence();
    let closed_gen = shared.wal.rotate()?;
    // A large transaction committed without a batch record: its LSN is marked in the
    // log once this checkpoint is durable (see `write`). Only a commit holding the
    // writer lock through its checkpoint leaves the log behind (`run_holding`).
    let unlogged = (shared.wal.last_lsn() < w.last_lsn).then_some(w.last_lsn);
    // Taken: this checkpoint writes the carried nodes (or carries them again).
    shared
        .carried_dirty_bytes
        .store(0, std::sync::atomic::Ordering::Relaxed);
    let frozen = Frozen {
        epoch: w.epoch,
        catalog: w.catalog.clone(),
        ref_changes: w.refs.take_changes(),
        unmerged: w.refs.unmerged(),
        drop_queue: w.drop_queue.clone(),
        lsn: w.last_lsn,
        delta: std::mem::take(&mut w.delta),
        next_wal_gen: closed_gen + 1,
        append_fence,
        backrefs: std::mem::take(&mut w.backrefs),
        superseded: std::mem::take(&mut w.superseded),
        unlogged,
        dirty_bytes: w.dirty_bytes,
        carried,
    };
    w.epoch += 1;
    w.dirty_bytes = 0;
    Ok(frozen)
}

/// Dirty nodes reachable from the frozen roots, one list per level, each node once
/// (versions share dirty nodes too). Clean subtrees are never entered, so this reads
/// nothing from disk.
fn collect_dirty(shared: &Shared, catalog: &Catalog) -> Result<Vec<Vec<Arc<Node>>>> {
    struct Dirty {
        levels: Vec<Vec<Arc<Node>>>,
        seen: HashSet<*const Node>,
    }
    impl Visitor for Dirty {
        fn enter(&mut self, at: &At<'_>) -> Result<bool> {
            Ok(match at.child {
                Child::Mem(n) => n.is_dirty() && self.seen.insert(Arc::as_ptr(n)),
                Child::Disk(_) => false,
            })
        }
        fn visit(&mut self, _at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
            let level = usize::from(node.level);
            if self.levels.len() <= level {
                self.levels.resize_with(level + 1, Vec::new);
            }
            self.levels[level].push(node.clone());
            Ok(true)
        }
    }
    let mut dirty = Dirty {
        levels: Vec::new(),
        seen: HashSet::new(),
    };
    for root in catalog.versions.iter().filter_map(|v| v.root.as_ref()) {
        walk(&mut shared.loader(), root, &mut dirty)?;
    }
    Ok(dirty.levels)
}

/// What a checkpoint's metadata blob records, and what the checkpoint keeps.
struct MetaPlan {
    delta: MetaDelta,
    /// The pending deletions once the checkpoint is durable.
    pending: Vec<PendingDelete>,
    /// Addresses recorded from in-memory counts (see `Durable::recorded_from_mem`).
    recorded_from_mem: Vec<Addr>,
}

/// The delta from the durable metadata to the state this checkpoint makes durable.
fn plan_meta(
    shared: &Shared,
    durable: &Durable,
    frozen: &Frozen,
    written: &SpaceDelta,
    generation: u64,
) -> Result<MetaPlan> {
    // In order: an address changed twice keeps its last count.
    let mut ref_changes: BTreeMap<Addr, u32> = frozen.ref_changes.iter_ordered().collect();
    let mut recorded_from_mem = Vec::new();
    for (node, count) in &frozen.unmerged {
        // Every node with a count above one is reachable from a root, so written.
        if let Some(r) = node.disk.get() {
            ref_changes.insert(r.addr, *count);
            recorded_from_mem.push(r.addr);
        }
    }
    let usage = usage_changes(&durable.meta.usage, &frozen.delta, written);
    let (versions, removed) = durable.meta.catalog_changes(&frozen.catalog);
    let pending = pending_after(
        shared,
        durable,
        &usage,
        &frozen.append_fence,
        frozen.lsn,
        generation,
    )?;
    let persisted: Vec<PendingSegment> = pending.iter().map(PendingDelete::persisted).collect();
    let drop_queue = frozen.drop_queue.clone();
    let delta = MetaDelta {
        next_id: frozen.catalog.next_id,
        versions,
        removed,
        usage,
        refcounts: ref_changes.into_iter().collect(),
        drop_queue: (drop_queue != durable.meta.drop_queue).then_some(drop_queue),
        pending_deletes: (persisted != durable.meta.pending_deletes).then_some(persisted),
        // Set by `write`, once the run is persisted.
        backref_manifest: None,
    };
    Ok(MetaPlan {
        delta,
        pending,
        recorded_from_mem,
    })
}

/// Writes the frozen state; returns its epoch once it is durable. A failure poisons
/// the store, except a full disk met while appending the nodes, the back references
/// or the metadata: that checkpoint is put off ([`put_off`]).
fn write(shared: &Shared, durable: &mut Durable, mut frozen: Frozen) -> Result<u64> {
    // A checkpoint that has begun spends the reserve rather than fail: one that could
    // wait began only with room (`has_room`), so it meets a full disk only if
    // something else filled it meanwhile. A spent reserve is allocated again by the
    // next checkpoint or close with room.
    let _finish = crate::io::allow_reserve();
    let put_off_before = frozen.carried.is_some();
    frozen.take_in_carried();
    // After the carried changes: these are this interval's.
    frozen.free_superseded(shared, put_off_before);
    let mut written = SpaceDelta::default();
    let nodes = collect_dirty(shared, &frozen.catalog)
        .and_then(|levels| write_levels(shared, &levels, &mut written, &mut frozen.backrefs));
    if let Err(e) = nodes {
        return Err(put_off(shared, durable, frozen, written, e));
    }
    finish(shared, durable, frozen, written)
}

/// A checkpoint whose appends failed (its nodes', its back-reference run's or its
/// metadata blob's): nothing durable has changed yet (the superblock still names the
/// previous checkpoint, the log still holds every commit since it, and what was
/// appended is bytes in a segment nothing durable names), so
/// on a full disk it is put off rather than poisoning the store: what it took from
/// the writer at its freeze goes back (`Durable::carried`) for the next checkpoint,
/// which writes what this one did not. The store stays writable; commits go on into
/// the log, and the next checkpoint with room makes them durable. (A disk another
/// process kept full past `Vfs::full_disk_patience` under a checkpoint used to
/// poison a server until it was restarted.)
///
/// Other errors still poison: an I/O error other than a full disk may mean a failing
/// device, a failed segment fsync (a new segment's, say) fails every later one
/// anyway, and a large transaction committing by this checkpoint (`unlogged`) is in
/// the writer's state without a log record, so the store must not go on without it.
fn put_off(
    shared: &Shared,
    durable: &mut Durable,
    frozen: Frozen,
    written: SpaceDelta,
    e: crate::error::Error,
) -> crate::error::Error {
    if !e.is_storage_full() || frozen.unlogged.is_some() || shared.segments.syncs_failed() {
        shared.poison(&e);
        return e;
    }
    let mut delta = frozen.delta;
    delta.merge(written);
    shared
        .carried_dirty_bytes
        .store(frozen.dirty_bytes, std::sync::atomic::Ordering::Relaxed);
    durable.carried = Some(crate::engine::CarriedOver {
        ref_changes: frozen.ref_changes,
        delta,
        backrefs: frozen.backrefs,
        dirty_bytes: frozen.dirty_bytes,
    });
    e
}

/// What a checkpoint appended after its nodes, for the syncs and the superblock.
struct Appended {
    generation: u64,
    meta_ref: BlockRef,
    chain: Chain,
    run_segments: Vec<SegmentId>,
    pending: Vec<PendingDelete>,
    recorded_from_mem: Vec<Addr>,
}

/// The rest of a checkpoint once its nodes are written: their back references and
/// the metadata blob, appended (a full disk there puts the checkpoint off, as in the
/// nodes' writes), then the syncs and the superblock.
fn finish(
    shared: &Shared,
    durable: &mut Durable,
    mut frozen: Frozen,
    written: SpaceDelta,
) -> Result<u64> {
    let appended = match append_meta(shared, durable, &mut frozen, &written) {
        Ok(appended) => appended,
        Err(e) => return Err(put_off(shared, durable, frozen, written, e)),
    };
    make_durable(shared, durable, &frozen, appended).inspect_err(|e| shared.poison(e))
}

/// Appends the checkpoint's back-reference run and its metadata blob, changing
/// nothing in memory but the back-reference store (whose new run the next manifest
/// names even if this checkpoint is put off: `frozen.backrefs` is then emptied, so
/// that the next one does not record its edges twice).
fn append_meta(
    shared: &Shared,
    durable: &mut Durable,
    frozen: &mut Frozen,
    written: &SpaceDelta,
) -> Result<Appended> {
    let generation = durable.sb.generation + 1;
    let MetaPlan {
        mut delta,
        pending,
        recorded_from_mem,
    } = plan_meta(shared, durable, frozen, written, generation)?;
    // The back references of this generation: one run, appended to the segments and
    // made durable by their sync below, before the superblock.
    let (manifest, run_segments) = {
        let mut store = lock(&shared.backrefs);
        let asked = shared
            .compact_backrefs
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        // Runs that keep an otherwise empty segment alive are compacted into a new
        // run appended elsewhere (as the chain is rebased below), so the segment can go.
        let evacuate = store
            .segments()
            .iter()
            .any(|seg| pending.iter().any(|p| p.segment == *seg));
        let manifest = store
            .persist(
                &shared.segments,
                &frozen.backrefs,
                generation,
                asked || evacuate,
            )
            .inspect_err(|_| {
                // Still wanted by the checkpoint that finishes this one.
                if asked {
                    shared
                        .compact_backrefs
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            })?;
        frozen.backrefs = WriteStore::default();
        (manifest, store.segments())
    };
    delta.backref_manifest = (manifest != durable.meta.backref_manifest).then_some(manifest);
    // A chain that keeps an otherwise empty segment alive is rewritten as a base, so
    // the segment can go.
    let rebase = durable
        .chain
        .segments()
        .any(|seg| pending.iter().any(|p| p.segment == seg));
    let (meta_ref, chain) = write_meta(shared, durable, delta, rebase)?;
    Ok(Appended {
        generation,
        meta_ref,
        chain,
        run_segments,
        pending,
        recorded_from_mem,
    })
}

/// The syncs and the superblock that make an appended checkpoint durable, and what
/// follows from it. A failure here poisons the store.
fn make_durable(
    shared: &Shared,
    durable: &mut Durable,
    frozen: &Frozen,
    appended: Appended,
) -> Result<u64> {
    let Appended {
        generation,
        meta_ref,
        chain,
        run_segments,
        pending,
        recorded_from_mem,
    } = appended;
    shared.segments.sync()?;
    // The log up to the freeze, durable before the superblock that covers it: the
    // freeze left the closed generation's tail unwritten (`Wal::rotate`), and should
    // this superblock slot ever be damaged, recovery from the other one replays it.
    shared.wal.sync_rotated(&shared.segments)?;
    let sb = Superblock {
        generation,
        checkpoint_lsn: frozen.lsn,
        wal_gen: frozen.next_wal_gen,
        meta: meta_ref,
        created_unix_ms: durable.sb.created_unix_ms,
    };
    SuperblockFile::write(&*durable.sb_file, &sb)?;
    // Durable from here on. The previous superblock becomes the fallback; keep the log
    // it replays from, and the metadata chain it reads.
    let previous = std::mem::replace(&mut durable.sb, sb);
    shared
        .durable_generation
        .store(sb.generation, std::sync::atomic::Ordering::Relaxed);
    durable.fallback = Some(previous);
    durable.fallback_chain = std::mem::replace(&mut durable.chain, chain);
    durable.fallback_run_segments = std::mem::replace(&mut durable.run_segments, run_segments);
    durable.recorded_from_mem = recorded_from_mem;
    durable.meta_bytes_last = u64::from(meta_ref.len);
    shared.wal.checkpoint_done();
    if let Some(lsn) = frozen.unlogged {
        // The marker tells a recovery from the other slot that this LSN was
        // committed, by a checkpoint it cannot see, rather than letting it reopen
        // without it. Appended only now: any sync (they take no writer lock) may write
        // the log's buffer, and a marker durable before its superblock would make
        // recovery from the previous one, the only one then, refuse to open. The
        // caller holds the writer lock, so no record was appended since the freeze.
        shared.wal.append_checkpoint_commit(lsn, generation)?;
    }
    wal::remove_below(&*shared.vfs, previous.wal_gen)?;
    // Add the segments this generation emptied; entries deleted meanwhile (by the
    // previous checkpoint's `after_durable`, on another thread) stay deleted.
    let mut current = lock(&shared.pending_deletes);
    for p in pending {
        if p.generation == generation && !current.iter().any(|c| c.segment == p.segment) {
            current.push(p);
        }
    }
    drop(current);
    Ok(frozen.epoch)
}

/// New live bytes of every segment the interval's delta or the checkpoint's writes
/// touched (0: the segment holds nothing live any more).
fn usage_changes(
    old: &crate::space::Usage,
    delta: &SpaceDelta,
    written: &SpaceDelta,
) -> Vec<(SegmentId, u64)> {
    let mut touched = SpaceDelta::default();
    touched.merge(delta.clone());
    touched.merge(written.clone());
    touched
        .per_segment
        .iter()
        .filter(|(_, d)| **d != 0)
        .map(|(&seg, &d)| {
            let live =
                i64::try_from(old.get(&seg).copied().unwrap_or(0)).expect("live bytes fit i64");
            let new = live + d;
            assert!(
                new >= 0,
                "segment {seg:?} live bytes would go negative ({live} {d:+})"
            );
            (seg, u64::try_from(new).expect("checked non-negative"))
        })
        .collect()
}

/// The pending deletions once this checkpoint is durable: those still waiting, plus
/// every segment with no live bytes in the new usage that no post-freeze write can be
/// using (emptied by this generation, or found empty at the first checkpoint after
/// an open).
fn pending_after(
    shared: &Shared,
    durable: &Durable,
    usage: &[(SegmentId, u64)],
    fence: &AppendFence,
    lsn: Lsn,
    generation: u64,
) -> Result<Vec<PendingDelete>> {
    let live_after = |seg: SegmentId| match usage.iter().find(|(s, _)| *s == seg) {
        Some(&(_, live)) => live > 0,
        None => durable.meta.usage.contains_key(&seg),
    };
    let mut pending: Vec<PendingDelete> = lock(&shared.pending_deletes).iter().copied().collect();
    for (id, _) in shared.segments.sizes()? {
        if !live_after(id) && !fence.may_grow(id) && !pending.iter().any(|p| p.segment == id) {
            pending.push(PendingDelete {
                segment: id,
                lsn,
                generation,
            });
        }
    }
    pending.sort_by_key(|p| p.segment);
    Ok(pending)
}

/// Appends this checkpoint's metadata blob: the delta, linked to the durable chain,
/// or a new base when the chain has grown past its base (see `meta::chain`) or when
/// `rebase` asks for one. Folds the delta into `durable.meta` once the blob is
/// appended (a checkpoint put off by a full disk here leaves it as it was; a base is
/// encoded from a folded copy, the reference-count table included, which a rebase
/// holds beside the original while it writes); returns the blob and the new chain.
fn write_meta(
    shared: &Shared,
    durable: &mut Durable,
    delta: MetaDelta,
    rebase: bool,
) -> Result<(BlockRef, Chain)> {
    let mut encoded = meta::encode_delta(&delta);
    match durable.chain.next_link(encoded.len()).filter(|_| !rebase) {
        Some(link) => {
            meta::link_delta(&mut encoded, &link);
            let r = shared.segments.append(&encoded)?;
            durable.meta.apply(delta)?;
            let mut chain = durable.chain.clone();
            chain.blobs.push(r);
            Ok((r, chain))
        }
        None => {
            let mut meta = durable.meta.clone();
            meta.apply(delta)?;
            let r = shared.segments.append(&meta::encode_base(&meta))?;
            durable.meta = meta;
            Ok((r, Chain::of_base(r)))
        }
    }
}

/// Writes `levels` bottom-up (a node's children are written before it) and records
/// every pointer of a node written now as a back reference in `backrefs`.
pub(crate) fn write_levels(
    shared: &Shared,
    levels: &[Vec<Arc<Node>>],
    written: &mut SpaceDelta,
    backrefs: &mut WriteStore,
) -> Result<()> {
    let wrote = levels
        .iter()
        .try_for_each(|level| write_level(shared, level, written));
    // A node has at most one child per entry; sized up front, as a GiB of volume
    // writes gives a quarter of a million edges (see `BackrefStore::checkpoint`).
    // Every node written records its edges, those before a failed write too: a
    // checkpoint put off hands them to the next one with the nodes (`put_off`).
    let mut edges = Vec::with_capacity(levels.iter().flatten().map(|n| n.len()).sum());
    for node in levels.iter().flatten() {
        if let Some(r) = node.disk.get() {
            edges.extend(node_children(node).map(|child| (child, r.addr)));
        }
    }
    backrefs.add_written(edges);
    wrote
}

/// Writes one level's dirty nodes in large appends and records their addresses (a
/// large transaction's spill writes its own nodes with it too).
pub(crate) fn write_level(
    shared: &Shared,
    nodes: &[Arc<Node>],
    written: &mut SpaceDelta,
) -> Result<()> {
    let mut buf = Vec::with_capacity(WRITE_CHUNK_BYTES + crate::btree::node::NODE_MAX * 2);
    let mut pending: Vec<(&Arc<Node>, usize, usize)> = Vec::new();
    for node in nodes {
        let start = buf.len();
        node.encode(&mut buf);
        pending.push((node, start, buf.len() - start));
        if buf.len() >= WRITE_CHUNK_BYTES {
            flush_chunk(shared, &buf, &pending, written)?;
            buf.clear();
            pending.clear();
        }
    }
    if !pending.is_empty() {
        flush_chunk(shared, &buf, &pending, written)?;
    }
    Ok(())
}

fn flush_chunk(
    shared: &Shared,
    buf: &[u8],
    nodes: &[(&Arc<Node>, usize, usize)],
    written: &mut SpaceDelta,
) -> Result<()> {
    let (base, segment) = shared.segments.append_many(buf)?;
    for &(node, start, len) in nodes {
        let bytes = &buf[start..start + len];
        let r = BlockRef {
            addr: Addr::new(segment, base.offset() + start as u64),
            len: len_u32(len),
            crc: crc(bytes),
        };
        node.disk.set(r).expect("a dirty node is written once");
        written.alloc(r);
        // Cache the clean node in its packed form, the bytes just written (it names
        // its children by address, and reads search it faster than the editable form:
        // prefix-compressed 4-byte heads, and its parts allocated together).
        match Node::decode_checked(bytes.to_vec(), r) {
            Ok(packed) => shared.cache.insert(r.addr, Arc::new(packed)),
            Err(e) => debug_assert!(false, "a node we encoded does not parse: {e}"),
        }
    }
    Ok(())
}

/// Work after a durable checkpoint that must not fail it: deleting emptied segments
/// nobody can reach, folding the written nodes' reference counts into the table, and
/// letting go of in-memory trees that are now on disk.
fn after_durable(shared: &Shared, epoch: u64) {
    delete_unreachable_segments(shared);
    unpin_written_roots(shared, epoch);
    shared.segments.fit_to_free_space();
}

/// Whether a pending deletion waits only for the next checkpoint: emptied by the
/// durable generation (the fallback slot reaches it) and not kept for another reason
/// (a blob the newest slot reads, a reader view, the active segment). A blob only the
/// fallback slot reads no longer holds it after the next checkpoint. (The segment
/// with the highest id counts: that checkpoint cuts it back to its header.)
pub(crate) fn deletions_wait_for_next_generation(shared: &Shared) -> bool {
    let (generation, metas) = {
        let d = lock(&shared.durable);
        (d.sb.generation, d.current_meta_segments())
    };
    let oldest_view = shared.views.oldest();
    lock(&shared.pending_deletes).iter().any(|p| {
        p.generation >= generation
            && oldest_view.is_none_or(|v| v >= p.lsn)
            && !metas.contains(&p.segment)
            && !shared.segments.is_active(p.segment)
            && !(shared.segments.is_highest(p.segment) && shared.segments.is_cut(p.segment))
    })
}

/// Deletes every pending segment that nothing can reach any more: a later generation
/// is durable (so neither superblock slot reaches it), it holds no blob of either
/// slot's metadata chain or back-reference runs, no reader view is older than the
/// checkpoint that emptied it, it is not a segment appends go to, and it is not the
/// segment with the highest id (ids are never reused).
pub(crate) fn delete_unreachable_segments(shared: &Shared) {
    let (generation, metas) = {
        let d = lock(&shared.durable);
        (d.sb.generation, d.meta_segments())
    };
    let oldest_view = shared.views.oldest();
    let mut pending = lock(&shared.pending_deletes);
    let mut removed = Vec::new();
    pending.retain(|p| {
        let reachable = oldest_view.is_some_and(|v| v < p.lsn)
            || generation <= p.generation
            || metas.contains(&p.segment)
            || shared.segments.is_active(p.segment);
        if reachable {
            return true;
        }
        if shared.segments.is_highest(p.segment) {
            // Kept for its name (ids are never reused), not for its bytes: cut back to
            // its header, it gives its space back now and is deleted once a newer
            // segment exists.
            shared.segments.cut_to_header(p.segment);
            return true;
        }
        // A failed delete leaves dead bytes behind, nothing worse; try again later.
        if shared.segments.delete(p.segment).is_err() {
            return true;
        }
        removed.push(p.segment);
        false
    });
    drop(pending);
    // The deletion vector may name a segment only once its removal is durable: a
    // power loss can bring back a file whose directory entry's removal was not
    // synced, and a segment that is back may take appends again (it may be the newest
    // of its kind), whose back references the deletion vector would then kill. If
    // the sync fails, the segments stay out of the vector: their records are dead
    // anyway (every parent of a block in them was freed), only purged later.
    if removed.is_empty() || shared.vfs.sync_dir().is_err() {
        return;
    }
    // No back reference can name them any more: compaction may purge their records.
    let mut backrefs = lock(&shared.backrefs);
    for segment in removed {
        backrefs.delete_segment(segment);
    }
}

/// Replaces in-memory roots whose trees are fully written by their addresses, so the
/// tree is held by the page cache (bounded, and in the packed form readers search
/// fastest) instead of pinned by the root in the editable form.
fn unpin_written_roots(shared: &Shared, epoch: u64) {
    let Ok(mut guard) = shared.writer.try_lock() else {
        return;
    };
    // A root is named by address only once its count is in the table by address.
    guard.refs.merge_written(epoch);
    let w = &mut *guard;
    let mut changed = false;
    for v in &mut w.catalog.versions {
        if let Some(Child::Mem(n)) = &v.root {
            if w.refs.is_unmerged(n) {
                continue;
            }
            if let Some(r) = n.disk.get().copied() {
                v.root = Some(Child::Disk(r));
                changed = true;
            }
        }
    }
    if !changed {
        return;
    }
    let view = shared.view_of(w);
    // The view this replaces holds the in-memory trees the checkpoint wrote; freeing
    // them is not the writers' wait.
    drop(guard);
    shared.republish(view);
}
