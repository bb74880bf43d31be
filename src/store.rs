//! The public facade: [`Store`], a cheap cloneable handle on one open store, plus
//! what only the facade does: closing (shutdown) and the background worker.
//!
//! Everything else lives below: the shared state in `engine`, opening in `recovery`,
//! transactions in `txn`, versions in `versions`, checkpoints in `checkpoint`.
//!
//! Life cycle: the store stays open while any `Store` handle exists. When the last
//! one goes (or [`Store::close`] is called), the background thread stops and, unless
//! disabled, a checkpoint writes everything out. Readers and iterators that outlive
//! the handles keep working on their views.

use crate::catalog::{VersionKind, MAIN_BRANCH};
use crate::checkpoint;
use crate::clean::{self, CleanReport};
use crate::commit;
use crate::engine::{Shared, Signal};
use crate::error::{Error, Result};
use crate::io::{Reserve, ReserveVfs, StdVfs, Vfs};
use crate::options::{Durability, Options};
use crate::recovery;
use crate::refs::{self, BlockRefs};
use crate::stats::{self, Stats};
use crate::subtree_memo;
use crate::sync::lock;
use crate::txn::{ReadTxn, WriteTxn};
use crate::verify::{self, VerifyReport};
use crate::versions::{self, Diff, VersionInfo};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A cambium store: a cheap, cloneable handle.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    /// Space held back for the commands that free space on a full disk.
    reserve: Arc<Reserve>,
    /// Shuts the store down when the last handle goes.
    _closer: Arc<Closer>,
}

/// Runs the shutdown when dropped (held once, shared by every handle).
struct Closer(Arc<Shared>, Arc<Reserve>);

impl Drop for Closer {
    fn drop(&mut self) {
        let _ = shutdown(&self.0, &self.1);
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The engine's shared state (for tests of its internals).
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Creates a new store in `dir` (created if missing) with default options.
    pub fn create(dir: impl AsRef<Path>) -> Result<Store> {
        Self::create_with(dir, Options::default())
    }

    /// Creates a new store in `dir` with `opts`.
    pub fn create_with(dir: impl AsRef<Path>, opts: Options) -> Result<Store> {
        let dir = dir.as_ref();
        if opts.read_only {
            return Err(Error::InvalidArgument(
                "cannot create a store read-only".into(),
            ));
        }
        let label = dir.display().to_string();
        let mut made_dir = false;
        let vfs: Arc<dyn Vfs> = match &opts.vfs {
            Some(v) => v.clone(),
            None => {
                if dir.exists() && !dir.is_dir() {
                    return Err(Error::InvalidArgument(format!(
                        "{label} exists and is not a directory"
                    )));
                }
                made_dir = !dir.exists();
                create_dir_durably(dir)?;
                Arc::new(StdVfs::new(dir))
            }
        };
        if let Err(e) = recovery::create(&vfs, &label) {
            if made_dir {
                // Nothing of the failed creation stays behind (it removed its files;
                // this removes the lock file and the directory it made).
                let _ = std::fs::remove_file(dir.join(crate::io::LOCK_FILE));
                let _ = std::fs::remove_dir(dir);
            }
            return Err(e);
        }
        let store = Self::open_with(dir, opts)?;
        // Best effort: on a disk too full for it, a later close allocates it.
        let _ = store.reserve.restore(crate::io::reserve_for(0));
        Ok(store)
    }

    /// Opens an existing store with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(dir, Options::default())
    }

    /// Opens an existing store for reading only: nothing in the directory is created
    /// or written (it works without write permission, on a read-only mount), and a
    /// process writing to the store meanwhile neither blocks this open nor is blocked
    /// by it. The handle sees the store's durable state as of the open (the last
    /// checkpoint plus every commit the writer has made durable); writes fail with
    /// [`Error::ReadOnly`].
    ///
    /// ```
    /// # fn main() -> cambium::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// let writer = cambium::Store::create(dir.path().join("db"))?;
    /// writer.put(b"k", b"v")?;
    /// let reader = cambium::Store::open_read_only(dir.path().join("db"))?; // beside the writer
    /// assert_eq!(reader.read()?.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(
            dir,
            Options {
                read_only: true,
                ..Options::default()
            },
        )
    }

    /// Opens an existing store: newest valid superblock, then WAL replay.
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<Store> {
        let dir = dir.as_ref();
        let label = dir.display().to_string();
        let vfs: Arc<dyn Vfs> = match &opts.vfs {
            Some(v) => v.clone(),
            None => {
                if !dir.exists() {
                    return Err(Error::MissingStore(label));
                }
                if !dir.is_dir() {
                    return Err(Error::NotAStore(label));
                }
                if opts.read_only {
                    Arc::new(StdVfs::read_only(dir))
                } else {
                    Arc::new(StdVfs::new(dir))
                }
            }
        };
        let (vfs, reserve) = ReserveVfs::wrap(vfs);
        let shared = recovery::open(vfs, dir, label, opts)?;
        if !shared.opts.read_only {
            // A crashed writer's large transaction may have left its sorted runs;
            // this process holds the writer lock now, and no transaction has begun.
            crate::txn::remove_stale_runs(&*shared.vfs)?;
        }
        subtree_memo::load(&shared);
        if !shared.opts.read_only && shared.opts.background_checkpoints {
            start_background(&shared, &reserve);
            if !lock(&shared.writer).drop_queue.is_empty() {
                shared.wake_background();
            }
        }
        Ok(Store {
            _closer: Arc::new(Closer(shared.clone(), reserve.clone())),
            reserve,
            shared,
        })
    }

    /// The store's directory (or label, for a custom file system).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Starts a write transaction on `main`. Blocks while another one is open.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        self.begin_write_on(MAIN_BRANCH)
    }

    /// Starts a write transaction on `branch`.
    pub fn begin_write_on(&self, branch: &str) -> Result<WriteTxn<'_>> {
        WriteTxn::begin(&self.shared, branch)
    }

    /// A consistent view of `main`'s committed state.
    pub fn read(&self) -> Result<ReadTxn> {
        self.read_at(MAIN_BRANCH)
    }

    /// A consistent view of the named version's committed state.
    pub fn read_at(&self, version: &str) -> Result<ReadTxn> {
        ReadTxn::new(self.shared.clone(), self.shared.published(), version)
    }

    /// The names of the versions, in the order they were made, with their kinds: the
    /// committed catalog as readers see it, without the space accounting that
    /// [`Store::versions`] computes.
    pub fn version_names(&self) -> Vec<(String, VersionKind)> {
        let view = self.shared.published();
        view.versions
            .iter()
            .map(|v| (v.name.to_string(), v.kind))
            .collect()
    }

    /// Whether `version` is a branch or a snapshot.
    pub fn version_kind(&self, version: &str) -> Result<VersionKind> {
        let view = self.shared.published();
        view.version(version)
            .map(|v| v.kind)
            .ok_or_else(|| Error::VersionNotFound(version.to_owned()))
    }

    /// Reads one key of `main`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read()?.get(key)
    }

    /// Writes one key of `main` in its own durable transaction.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut txn = self.begin_write()?;
        txn.put(key, value)?;
        txn.commit()
    }

    /// Deletes one key of `main` in its own durable transaction; true if it existed.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let mut txn = self.begin_write()?;
        let existed = txn.delete(key)?;
        txn.commit()?;
        Ok(existed)
    }

    /// Makes a read-only version `name` of `source` (a branch or a snapshot), in
    /// constant time: it copies `source`'s root, never its data. Durable on return.
    pub fn snapshot(&self, source: &str, name: &str) -> Result<()> {
        self.snapshot_with(source, name, Durability::Immediate)
    }

    /// [`Store::snapshot`] with a choice of durability: `Deferred` returns without
    /// waiting for the WAL fsync (the snapshot is visible at once and durable with the
    /// next fsync or checkpoint), for callers that make many at a time.
    pub fn snapshot_with(&self, source: &str, name: &str, durability: Durability) -> Result<()> {
        self.copy_version(source, name, VersionKind::Snapshot, durability)
            .map(|_| ())
    }

    /// A snapshot or clone of `source`; returns when it came to exist (under the
    /// writer lock, before it was made durable): what `cambium volume snapshot`
    /// reports as the pause.
    pub(crate) fn copy_version(
        &self,
        source: &str,
        name: &str,
        kind: VersionKind,
        durability: Durability,
    ) -> Result<std::time::Instant> {
        versions::make_version(&self.shared, Some(source), name, kind, durability)
    }

    /// Makes a writable clone `name` of `source` (a branch or a snapshot), in constant
    /// time. The two then diverge independently. Durable on return.
    pub fn branch(&self, source: &str, name: &str) -> Result<()> {
        self.branch_with(source, name, Durability::Immediate)
    }

    /// [`Store::branch`] with a choice of durability (see [`Store::snapshot_with`]).
    pub fn branch_with(&self, source: &str, name: &str, durability: Durability) -> Result<()> {
        self.copy_version(source, name, VersionKind::Branch, durability)
            .map(|_| ())
    }

    /// Makes a new, empty branch `name`, made from no other version (a volume's tree
    /// starts so). Durable on return.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = cambium::Store::create(dir.path())?;
    /// store.put(b"k", b"v")?;
    /// store.create_branch("scratch")?;
    /// assert_eq!(store.read_at("scratch")?.first()?, None);
    /// # Ok::<(), cambium::Error>(())
    /// ```
    pub fn create_branch(&self, name: &str) -> Result<()> {
        self.create_branch_with(name, Durability::Immediate)
    }

    /// [`Store::create_branch`] with a choice of durability (see [`Store::snapshot_with`]).
    pub fn create_branch_with(&self, name: &str, durability: Durability) -> Result<()> {
        versions::make_version(&self.shared, None, name, VersionKind::Branch, durability)
            .map(|_| ())
    }

    /// Whether a version operation is waiting for the writer lock (see
    /// `Volume::put_written_yielding`).
    pub(crate) fn version_op_waiting(&self) -> bool {
        self.shared.version_op_waiting()
    }

    /// Lets the version operations waiting for the writer lock have it first.
    pub(crate) fn let_version_ops_in(&self) {
        self.shared.let_version_ops_in();
    }

    /// Writes values over 1 KiB to a data segment ahead of the transaction that will
    /// name them (see `Segments::write_values_pinned`); hold the pin until it is over.
    pub(crate) fn write_values_pinned(
        &self,
        values: &[&[u8]],
        run: Option<&[u8]>,
    ) -> Result<(Vec<crate::format::BlockRef>, crate::space::Pin<'_>)> {
        self.shared.check_writable()?;
        let segments = &self.shared.segments;
        match segments.write_values_pinned(values, run) {
            // A full disk: once space is given back, one more try. (The failed
            // write's extents, if any, are dead space, never referenced.)
            Err(e) if e.is_storage_full() => {
                self.make_room()?;
                segments.write_values_pinned(values, run)
            }
            other => other,
        }
    }

    /// Gives back the space a full disk can get without the user's help, for a
    /// write of data that found it full: the spare files, the segments that data
    /// overwritten since the last checkpoint emptied (a checkpoint finds them, the
    /// next deletes them), then the dead bytes the cleaner can move out. A client
    /// that overwrites a volume as fast as it can, on a disk with little room,
    /// otherwise outruns the background checkpoints and gets `ENOSPC` while most of
    /// the store is dead space. One write at a time does it; others that found the
    /// disk full wait for it, then try again.
    fn make_room(&self) -> Result<()> {
        let shared = &self.shared;
        let Ok(_alone) = shared.making_room.try_lock() else {
            drop(lock(&shared.making_room));
            return Ok(());
        };
        shared.segments.discard_spares()?;
        // Checkpoints free space only if data was overwritten since the last one (the
        // segments it emptied): then they may use the reserve. Otherwise (a disk
        // another process filled) one would spend it and free nothing.
        let allowed = (shared.segments.data_since_fence() > 0).then(crate::io::allow_reserve);
        if shared.has_unwritten() && checkpoint::has_room(shared) {
            checkpoint::run(shared, None)?;
        }
        if checkpoint::deletions_wait_for_next_generation(shared) && checkpoint::has_room(shared) {
            checkpoint::run(shared, None)?;
        }
        drop(allowed);
        // Its moves are durable, and the segments they emptied deleted, when it
        // returns. (Without the reserve: moves free space only later.)
        clean::auto_clean(shared)?;
        Ok(())
    }

    /// Makes every transaction committed so far durable (those committed with
    /// [`Durability::Deferred`] included): one WAL fsync, shared with any other
    /// committer waiting for one, after the segments holding their out-of-line values.
    pub fn sync(&self) -> Result<()> {
        let shared = &self.shared;
        shared.check_writable()?;
        commit::sync_to(shared, shared.wal.last_lsn())
    }

    /// Removes the version `name`. The version is gone at once (durable on return);
    /// the space only it referenced is reclaimed by a walk that proceeds in the
    /// background, in bounded steps (Rodeh §5.4: it stops at nodes other versions
    /// share, which just lose a reference). [`Store::finish_drops`] runs it to the
    /// end. Versions made from this one keep all their data. `main`, the default
    /// branch, cannot be dropped ([`Error::DefaultBranch`]).
    pub fn drop_version(&self, name: &str) -> Result<()> {
        self.drop_version_if(name, None)
    }

    /// [`Store::drop_version`], with `only_id`: only if `name` is still the version
    /// with that id (a handle bound to it must not drop a newcomer of the same name).
    pub(crate) fn drop_version_if(&self, name: &str, only_id: Option<u32>) -> Result<()> {
        versions::drop_version(&self.shared, name, only_id)
    }

    /// Frees up to `max_nodes` nodes of dropped versions and returns whether more
    /// remain: the background thread's unit of work, for applications that run
    /// without one ([`Options::background_checkpoints`] off) and want to spread a big
    /// drop over their own idle time.
    pub fn drop_step(&self, max_nodes: usize) -> Result<bool> {
        let _allowed = crate::io::allow_reserve();
        versions::drop_step(&self.shared, max_nodes.max(1))
    }

    /// Runs the reclamation of dropped versions to the end (it otherwise proceeds in
    /// the background). The space it frees is reusable after the next checkpoint.
    pub fn finish_drops(&self) -> Result<()> {
        let _allowed = crate::io::allow_reserve();
        versions::finish_drops(&self.shared)
    }

    /// Brings back the space of dropped versions now, as a close does: their nodes
    /// freed ([`Store::finish_drops`]), the data stream moved on from its segment
    /// (which may hold their blocks: an active segment is never deleted), then
    /// checkpoints until the segments emptied are deleted, then cleans the segments
    /// they left at least half dead (`clean::clean_after_drop`). For a process that keeps
    /// the store open (a server): `cambium drop` through it returns with the space
    /// free, as it does on its own. On a full disk it may use the reserve.
    pub fn reclaim_dropped(&self) -> Result<()> {
        self.shared.check_writable()?;
        let allowed = crate::io::allow_reserve();
        versions::finish_drops(&self.shared)?;
        self.shared.segments.seal_data();
        // The first checkpoint leaves the dropped trees out of the durable state; the
        // second frees what they held alone (until then the durable state reached
        // it) and finds the segments that emptied; a third deletes them.
        checkpoint::run(&self.shared, None)?;
        checkpoint::run(&self.shared, None)?;
        if checkpoint::deletions_wait_for_next_generation(&self.shared) {
            checkpoint::run(&self.shared, None)?;
        }
        clean::clean_after_drop(&self.shared)?;
        // The space is the user's, not the next segments' to reuse.
        self.shared.segments.discard_spares()?;
        drop(allowed);
        self.restore_reserve();
        Ok(())
    }

    /// Every version, in the order they were made, with its space accounting. The
    /// figures count nodes as they are (or will be, once checkpointed) on disk.
    /// This reads every node of the store once (shared subtrees once), plus the
    /// nodes each version holds alone: its cost grows with the store.
    pub fn versions(&self) -> Result<Vec<VersionInfo>> {
        versions::list(&self.shared)
    }

    /// The keys added, removed and changed from version `a` to version `b`, in key
    /// order. It descends only where the two trees differ, so its cost follows the
    /// size of the change, not the size of the versions.
    pub fn diff(&self, a: &str, b: &str) -> Result<Diff> {
        versions::diff(&self.shared, a, b)
    }

    /// Finishes freeing dropped versions, then writes every dirty node and flips the
    /// superblock; returns when it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.check_writable()?;
        self.finish_drops()?;
        // It deletes the segments emptied since the last: on a full disk it may use
        // the reserve.
        let _allowed = crate::io::allow_reserve();
        checkpoint::run(&self.shared, None)
    }

    /// Runs the cleaner now: moves the live blocks out of the segments with the most
    /// dead space (by cost-benefit: free space gained times age, over the cost of
    /// the move) until dead bytes are at most `dead_below_percent` of the segment
    /// bytes, then deletes the emptied segments. Every version keeps its data and its
    /// sharing; readers go on meanwhile, writers wait for each round (at most 16 MiB
    /// moved).
    pub fn clean(&self, dead_below_percent: f64) -> Result<CleanReport> {
        self.clean_with_progress(dead_below_percent, &mut |_, _| {})
    }

    /// [`Store::clean`], calling `progress` with the bytes moved so far and in all.
    pub fn clean_with_progress(
        &self,
        dead_below_percent: f64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CleanReport> {
        if !(0.0..=100.0).contains(&dead_below_percent) {
            return Err(Error::InvalidArgument(format!(
                "dead-space target {dead_below_percent}% is not between 0 and 100"
            )));
        }
        self.shared.check_writable()?;
        let allowed = crate::io::allow_reserve();
        let report = clean::clean(&self.shared, dead_below_percent / 100.0, progress);
        drop(allowed);
        self.restore_reserve();
        report
    }

    /// Rewrites the nodes of `version` (every version for `None`) in key order, so its
    /// scans read sequentially. Nodes it shares with other versions stay shared.
    pub fn defrag(&self, version: Option<&str>) -> Result<CleanReport> {
        self.shared.check_writable()?;
        let allowed = crate::io::allow_reserve();
        let report = clean::defrag(&self.shared, version);
        drop(allowed);
        self.restore_reserve();
        report
    }

    /// Moves every live block out of segments that hold dead bytes (at least 1/64 of
    /// the segment) and deletes them: the store's footprint drops to about its live
    /// data plus the WAL. A second shrink right after moves next to nothing.
    pub fn shrink(&self) -> Result<CleanReport> {
        self.shrink_with_progress(&mut |_, _| {})
    }

    /// Brings the reserve back after space was freed, if a write took it (best
    /// effort: a disk still full leaves it to a later call or to the close), and ends
    /// a drop's permission to use it. A store that stays open (a server) gets its
    /// reserve back here, not only at close.
    fn restore_reserve(&self) {
        let _ = self
            .reserve
            .restore_if_taken(crate::io::reserve_for(segment_bytes(&self.shared)));
    }

    /// [`Store::shrink`], calling `progress` with the bytes moved so far and in all.
    pub fn shrink_with_progress(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<CleanReport> {
        self.shared.check_writable()?;
        let allowed = crate::io::allow_reserve();
        let report = clean::shrink(&self.shared, progress);
        drop(allowed);
        self.restore_reserve();
        report
    }

    /// The live blocks of segment `segment` (nodes and out-of-line values), each with
    /// the parent nodes that point at it, the key it sits under and the versions that
    /// reach it, in address order. A segment that does not exist has none.
    pub fn backrefs(&self, segment: u32) -> Result<Vec<BlockRefs>> {
        refs::segment_refs(&self.shared, crate::format::SegmentId(segment))
    }

    /// Sizes, counts and cache figures.
    pub fn stats(&self) -> Result<Stats> {
        stats::collect(&self.shared)
    }

    /// Checks the durable state on disk and the WAL after it (see [`VerifyReport`]).
    pub fn verify(&self) -> Result<VerifyReport> {
        verify::verify(&self.shared, &mut |_| {})
    }

    /// Like [`Store::verify`], calling `progress` with the bytes checked so far.
    pub fn verify_with_progress(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        verify::verify(&self.shared, progress)
    }

    /// Stops background work and, unless disabled, checkpoints. Other handles to the
    /// same store become unusable for writes.
    pub fn close(self) -> Result<()> {
        shutdown(&self.shared, &self.reserve)
    }
}

/// Stops the background thread and makes every acknowledged commit durable (and,
/// unless disabled, checkpointed). Runs once; later calls return at once.
fn shutdown(shared: &Shared, reserve: &Reserve) -> Result<()> {
    {
        let mut closed = lock(&shared.closed);
        if *closed {
            return Ok(());
        }
        *closed = true;
    }
    shared.signal(|work| work.stop = true);
    let handle = lock(&shared.bg_thread).take();
    if let Some(h) = handle {
        // The worker holds only a weak reference, so it is never the one running this.
        let _ = h.join();
    }
    if shared.opts.read_only {
        return Ok(());
    }
    if shared.opts.checkpoint_on_close && shared.check_writable().is_ok() {
        // Processes that open, write and close (the CLI) never see a background
        // thread: their closes clean, a bounded amount at a time. Best effort: a
        // failure that matters has poisoned the store, which is reported next.
        let _ = clean::auto_clean(shared);
    }
    if let Some(why) = lock(&shared.poisoned).as_ref() {
        // Commits not yet durable could not be made so: say it.
        return Err(Error::Poisoned(why.clone()));
    }
    // Deferred commits are acknowledged and visible: a clean close makes them
    // durable whether or not it checkpoints.
    commit::sync_to(shared, shared.wal.last_lsn())?;
    // No more data is appended: zeros written ahead of it are space the next process
    // would count as dead.
    shared.segments.trim_zeros();
    if !shared.opts.checkpoint_on_close {
        return Ok(());
    }
    // A drop interrupted by a crash (or left to a background thread this process
    // does not run) finishes here, so that its space comes back whatever the store
    // is used for (the CLI opens it for one command at a time).
    // Freeing space: on a full disk it may use the reserve (until the end of the
    // closing checkpoints, which give the space back).
    let dropped = !lock(&shared.writer).drop_queue.is_empty();
    let _allowed = dropped.then(crate::io::allow_reserve);
    versions::finish_drops(shared)?;
    // On a disk some other process filled, the closing checkpoints are put off
    // (`checkpoint::has_room`): the log holds every commit, the next open replays it.
    if shared.has_unwritten() && checkpoint::has_room(shared) {
        checkpoint::run(shared, None)?;
    }
    // Segments emptied by the last checkpoint wait for one more generation (the
    // fallback slot still reaches them): a tiny delta checkpoint releases them now
    // rather than in some later process.
    if checkpoint::deletions_wait_for_next_generation(shared) && checkpoint::has_room(shared) {
        checkpoint::run(shared, None)?;
    }
    if dropped {
        clean::clean_after_drop(shared)?;
    }
    // What `versions()` learnt, for the next process (a hint; failure is harmless).
    let _ = subtree_memo::save(shared);
    // Spare files serve this process's writes, and the next's only if asked
    // (`Options::keep_spares_at_close`): then at most half the limit (the data
    // checkpoint threshold's worth: the other half absorbs a running writer's
    // checkpoints) and no more than the segments' bytes, so that a close at most
    // doubles a small store's data.
    let _ = match shared.opts.keep_spares_at_close {
        true => shared
            .segments
            .trim_spares(shared.segments.spare_limit() / 2, segment_bytes(shared)),
        false => shared.segments.discard_spares(),
    };
    // Space freed by this session comes back as the reserve first. Best effort: a
    // disk still full leaves it for a later close.
    let _ = reserve.restore(crate::io::reserve_for(segment_bytes(shared)));
    Ok(())
}

fn start_background(shared: &Arc<Shared>, reserve: &Arc<Reserve>) {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let signal = shared.background.clone();
    let interval = shared.opts.checkpoint_interval;
    let reserve = reserve.clone();
    let handle = std::thread::Builder::new()
        .name("cambium-checkpoint".into())
        .spawn(move || background_loop(&weak, &signal, interval, &reserve));
    if let Ok(h) = handle {
        *lock(&shared.bg_thread) = Some(h);
    }
}

/// The background worker: frees dropped versions' nodes in small steps (commits
/// interleave), and checkpoints when asked or when the interval passes with anything
/// unwritten. After a checkpoint it brings the reserve to its size (a process that
/// lives on, a server, would otherwise keep the reserve its store had when it
/// opened). A whole interval with nothing unwritten gives back the spare files:
/// they serve a writer, and the store is idle. It holds the engine only while it
/// works, so the last handle's drop is never waiting on it for long.
fn background_loop(
    weak: &Weak<Shared>,
    signal: &Signal,
    interval: Option<Duration>,
    reserve: &Reserve,
) {
    let (m, cv) = signal;
    // When the cleaner last ran here (see below).
    let mut cleaned = std::time::Instant::now();
    // Whether the last checkpoint here was put off by a full disk: the next try comes
    // sooner than the interval, once the disk has room.
    let mut put_off = false;
    loop {
        let wait = if put_off {
            PUT_OFF_RETRY
        } else {
            interval.unwrap_or(Duration::from_secs(3600))
        };
        let (checkpoint_wanted, drops, timed_out) = {
            let mut work = lock(m);
            let mut timed_out = false;
            if !work.stop && !work.checkpoint && !work.drops {
                let waited = cv
                    .wait_timeout(work, wait)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                work = waited.0;
                timed_out = waited.1.timed_out();
            }
            if work.stop {
                return;
            }
            (
                std::mem::take(&mut work.checkpoint),
                std::mem::take(&mut work.drops),
                timed_out,
            )
        };
        let Some(shared) = weak.upgrade() else { return };
        if drops {
            loop {
                let stopping = lock(m).stop;
                if stopping || !versions::drop_step(&shared, 64).unwrap_or(false) {
                    break;
                }
            }
        }
        // Finished meanwhile by another checkpoint (a close's, a write making room)?
        put_off = put_off && shared.checkpoint_put_off();
        let due = checkpoint_wanted || ((put_off || interval.is_some()) && shared.has_unwritten());
        if due && shared.check_writable().is_ok() {
            // Asked for by the data threshold alone (a volume written fast): its
            // purpose is the segments that emptied, which need no cleaning.
            let for_data = checkpoint_wanted && shared.checkpoint_due_for_data_alone();
            // An error poisons the store inside `run`, or puts the checkpoint off (a
            // full disk), to be tried again soon; the thread carries on either way.
            // One for the data deletes the segments it emptied: on a full disk it may
            // use the reserve.
            let allowed = for_data.then(crate::io::allow_reserve);
            if !checkpoint::has_room(&shared) {
                // Put off until the disk has room (a later interval, or a write).
                continue;
            }
            if put_off {
                // The put-off checkpoint spent the reserve: with room again, the
                // retry gets one to finish on, should the disk fill under it again.
                let _ = reserve.restore(crate::io::reserve_for(segment_bytes(&shared)));
            }
            let failed = checkpoint::run(&shared, None).err();
            put_off = failed.is_some_and(|e| e.is_storage_full()) && shared.checkpoint_put_off();
            drop(allowed);
            if put_off {
                continue;
            }
            // Cleaning after a checkpoint: the usage table it reads is fresh. Not after
            // each of a fast writer's per-GiB checkpoints, which would move up to
            // 128 MiB each time under its feet (4 KiB random writes at QD32 lost a
            // quarter of their IOPS), but at most once an interval then. An error
            // here poisons like a checkpoint's, or leaves the store as it was.
            let pace = interval.unwrap_or(Duration::from_secs(30));
            // A disk short of space cleans after every checkpoint.
            if !for_data || cleaned.elapsed() >= pace || shared.segments.short_of_space() {
                let _ = clean::auto_clean(&shared);
                cleaned = std::time::Instant::now();
            }
            let _ = reserve.restore(crate::io::reserve_for(segment_bytes(&shared)));
        } else if interval.is_some() && timed_out && !drops {
            // Best effort: a spare left is removed by the close or a later one.
            let _ = shared.segments.discard_spares();
        }
    }
}

/// How soon the background thread tries a checkpoint again after a full disk put one
/// off.
const PUT_OFF_RETRY: Duration = Duration::from_secs(1);

/// The bytes of the store's segments (what the reserve is sized by).
fn segment_bytes(shared: &Shared) -> u64 {
    shared
        .segments
        .sizes()
        .map_or(0, |s| s.iter().map(|(_, n)| n).sum())
}

/// Creates `dir` and any missing parents, and syncs the parent of each directory it
/// creates, so that a power loss cannot lose the store's directory entry (and with it
/// the commits already acknowledged into it).
fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|p| !p.exists()).collect();
    std::fs::create_dir_all(dir)?;
    for created in missing.into_iter().rev() {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}
