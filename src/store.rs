//! The store: open/create/recover, the shared state behind every handle, and the
//! public entry points.
//!
//! Concurrency model:
//! - One writer at a time per store (`Shared::writer`); readers take an immutable
//!   [`View`] (published roots) and never block, nor are blocked by, the writer.
//! - A committing writer appends its WAL record under the writer lock, releases it,
//!   and then waits for the group-commit fsync; its new roots are published to
//!   readers only after they are durable (for `Durability::Immediate`).
//! - Checkpoints take the writer lock only to freeze; they write while commits go on.
//!   Lock order: `writer` before `durable`.

use crate::btree::node::Child;
use crate::btree::{self, Loader, WriteCtx};
use crate::cache::PageCache;
use crate::catalog::{Catalog, Meta, VersionId, VersionKind};
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::format::{BlockRef, Lsn};
use crate::io::{StdVfs, VFile, Vfs};
use crate::refcount::{RcDelta, RefCounts};
use crate::space::{Segments, SpaceDelta, Usage};
use crate::superblock::{Superblock, SuperblockFile};
use crate::txn::View;
use crate::wal::{self, BatchOp, Wal};
use crate::{ReadTxn, Stats, VerifyReport, WriteTxn};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

/// How to open a store.
#[derive(Clone)]
pub struct Options {
    /// Page cache budget in bytes.
    pub cache_bytes: usize,
    /// Checkpoint when this much WAL has accumulated since the last one.
    pub checkpoint_wal_bytes: u64,
    /// Checkpoint when this many bytes of nodes are dirty.
    pub checkpoint_dirty_bytes: u64,
    /// Checkpoint at least this often while there is anything to write.
    pub checkpoint_interval: Option<Duration>,
    /// Run checkpoints on a background thread (otherwise the committing thread runs
    /// them when a threshold is crossed, and the interval is not used).
    pub background_checkpoints: bool,
    /// Open without writing anything (shared process lock; the WAL is replayed in
    /// memory only).
    pub read_only: bool,
    /// Checkpoint when the store is closed or dropped, so the next open replays nothing.
    pub checkpoint_on_close: bool,
    /// The file system to use; `None` means real files in the store directory.
    pub vfs: Option<Arc<dyn Vfs>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 256 << 20,
            checkpoint_wal_bytes: 64 << 20,
            checkpoint_dirty_bytes: 256 << 20,
            checkpoint_interval: Some(Duration::from_secs(30)),
            background_checkpoints: true,
            read_only: false,
            checkpoint_on_close: true,
            vfs: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("cache_bytes", &self.cache_bytes)
            .field("checkpoint_wal_bytes", &self.checkpoint_wal_bytes)
            .field("checkpoint_dirty_bytes", &self.checkpoint_dirty_bytes)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("background_checkpoints", &self.background_checkpoints)
            .field("read_only", &self.read_only)
            .field("checkpoint_on_close", &self.checkpoint_on_close)
            .field("vfs", &self.vfs.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// When a commit is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// `commit` returns after the WAL fsync that covers it (group commit: concurrent
    /// committers share one fsync).
    #[default]
    Immediate,
    /// `commit` returns at once; the transaction is atomic and visible, and becomes
    /// durable with the next checkpoint or the next `Immediate` commit. For bulk loads.
    Deferred,
}

/// The writer's state: the newest roots (including commits not yet durable) and the
/// space bookkeeping of the current checkpoint interval.
pub(crate) struct WriterState {
    pub catalog: Catalog,
    /// Incremented by each checkpoint freeze; nodes made dirty carry it.
    pub epoch: u64,
    /// Live-byte changes since the last freeze.
    pub delta: SpaceDelta,
    /// Frozen nodes replaced since the last freeze (see `btree::write::shadow`).
    pub superseded: Vec<Arc<crate::btree::node::Node>>,
    /// Reference counts above one (see `crate::refcount`).
    pub refs: RefCounts,
    /// Written nodes of dropped versions that nothing references any more, waiting to
    /// be freed (their bytes) and to release their children (`versions::drop_step`).
    pub drop_queue: Vec<BlockRef>,
    pub last_lsn: Lsn,
    /// Approximate bytes of nodes dirtied since the last freeze.
    pub dirty_bytes: u64,
}

/// The durable state: what the newest superblock says. Guarded by the checkpoint lock.
pub(crate) struct Durable {
    pub sb: Superblock,
    /// The other slot's superblock, the one recovery falls back to if `sb`'s slot is
    /// damaged. Everything it needs is kept: WAL generations from its `wal_gen` on,
    /// and segments until a checkpoint after the one that emptied them.
    pub fallback: Option<Superblock>,
    pub sb_file: Arc<dyn VFile>,
    pub usage: Usage,
}

/// The LSNs of live reader views, so that space they can reach is not deleted.
#[derive(Default)]
pub(crate) struct ViewRegistry {
    active: Mutex<BTreeMap<Lsn, usize>>,
}

impl ViewRegistry {
    pub(crate) fn register(&self, lsn: Lsn) {
        *lock(&self.active).entry(lsn).or_default() += 1;
    }
    pub(crate) fn unregister(&self, lsn: Lsn) {
        let mut active = lock(&self.active);
        if let Some(n) = active.get_mut(&lsn) {
            *n -= 1;
            if *n == 0 {
                active.remove(&lsn);
            }
        }
    }
    pub(crate) fn oldest(&self) -> Option<Lsn> {
        lock(&self.active).keys().next().copied()
    }
}

#[derive(Default)]
struct Background {
    stop: bool,
    wanted: bool,
    /// A drop left nodes to free.
    drops: bool,
}

pub(crate) struct Shared {
    pub label: String,
    pub path: PathBuf,
    pub opts: Options,
    pub vfs: Arc<dyn Vfs>,
    pub segments: Segments,
    pub cache: PageCache,
    pub wal: Wal,
    pub writer: Mutex<WriterState>,
    pub durable: Mutex<Durable>,
    pub published: RwLock<Arc<View>>,
    pub views: Arc<ViewRegistry>,
    /// Segments emptied by a durable checkpoint, deletable once no view older than
    /// the LSN can reach them.
    pub pending_deletes: Mutex<Vec<crate::checkpoint::PendingDelete>>,
    pub poisoned: Mutex<Option<String>>,
    /// Whether the live data is small enough (under an eighth of the cache budget) for trees
    /// to stay linked in memory; updated by every checkpoint.
    pub keep_pinned: std::sync::atomic::AtomicBool,
    background: Arc<(Mutex<Background>, Condvar)>,
    /// Mirrors `durable.sb.generation`, readable without waiting for a checkpoint.
    pub durable_generation: std::sync::atomic::AtomicU64,
    bg_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    closed: Mutex<bool>,
    _process_lock: Box<dyn Send + Sync>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

    pub(crate) fn lock_writer(&self) -> MutexGuard<'_, WriterState> {
        lock(&self.writer)
    }

    /// Makes `view` what new readers see, unless a newer one is already published.
    pub(crate) fn publish(&self, view: Arc<View>) {
        let mut p = self
            .published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if view.lsn > p.lsn {
            *p = view;
        }
    }

    pub(crate) fn published(&self) -> Arc<View> {
        self.published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a checkpoint threshold has been crossed.
    pub(crate) fn checkpoint_due(&self, dirty_bytes: u64) -> bool {
        self.wal.bytes_since_checkpoint() > self.opts.checkpoint_wal_bytes
            || dirty_bytes > self.opts.checkpoint_dirty_bytes
    }

    /// The generation of the durable superblock.
    pub(crate) fn durable_generation(&self) -> u64 {
        self.durable_generation
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the background thread that dropped versions have nodes to free. Without
    /// one, they are freed by `finish_drops`, `checkpoint` and `close`.
    pub(crate) fn wake_background(&self) {
        let (m, cv) = &*self.background;
        lock(m).drops = true;
        cv.notify_one();
    }

    /// Asks for a checkpoint: wakes the background thread, or runs one here.
    pub(crate) fn request_checkpoint(&self) -> Result<()> {
        if self.opts.background_checkpoints {
            let (m, cv) = &*self.background;
            lock(m).wanted = true;
            cv.notify_one();
            Ok(())
        } else {
            checkpoint::run(self, None)
        }
    }

    fn shutdown(&self) -> Result<()> {
        {
            let mut closed = lock(&self.closed);
            if *closed {
                return Ok(());
            }
            *closed = true;
        }
        {
            let (m, cv) = &*self.background;
            lock(m).stop = true;
            cv.notify_all();
        }
        let handle = lock(&self.bg_thread).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        if self.opts.read_only {
            return Ok(());
        }
        if let Some(why) = lock(&self.poisoned).as_ref() {
            // Commits not yet durable could not be made so: say it.
            return Err(Error::Poisoned(why.clone()));
        }
        // Deferred commits are acknowledged and visible: a clean close makes them
        // durable whether or not it checkpoints.
        let last = self.wal.last_lsn();
        if let Err(e) = self.wal.sync_to(last, &self.segments) {
            self.poison(&e);
            return Err(e);
        }
        if self.opts.checkpoint_on_close && self.has_unwritten() {
            checkpoint::run(self, None)?;
        }
        Ok(())
    }

    /// Whether anything committed is not yet in a checkpoint.
    pub(crate) fn has_unwritten(&self) -> bool {
        let w = self.lock_writer();
        let durable_lsn = lock(&self.durable).sb.checkpoint_lsn;
        w.last_lsn > durable_lsn || !w.delta.is_empty()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A cambium store: a cheap, cloneable handle.
#[derive(Clone)]
pub struct Store {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Creates a new store in `dir` (created if missing) with default options.
    pub fn create(dir: impl AsRef<Path>) -> Result<Store> {
        Self::create_with(dir, Options::default())
    }

    /// Creates a new store in `dir` with `opts`.
    pub fn create_with(dir: impl AsRef<Path>, opts: Options) -> Result<Store> {
        let dir = dir.as_ref();
        let label = dir.display().to_string();
        if opts.read_only {
            return Err(Error::InvalidArgument(
                "cannot create a store read-only".into(),
            ));
        }
        let vfs: Arc<dyn Vfs> = match &opts.vfs {
            Some(v) => v.clone(),
            None => {
                std::fs::create_dir_all(dir)?;
                Arc::new(StdVfs::new(dir))
            }
        };
        {
            let _guard = vfs.lock(true)?;
            if vfs.exists(crate::superblock::FILE_NAME)? {
                return Err(Error::AlreadyExists(label));
            }
            let segments = Segments::open(vfs.clone(), false)?;
            let meta = Meta {
                catalog: Catalog::initial(),
                ..Meta::default()
            };
            let meta_ref = segments.append(&meta.encode())?;
            segments.sync()?;
            let sb_file = vfs.create(crate::superblock::FILE_NAME)?;
            let created = crate::format::now_unix_ms();
            // Both slots valid from the start: generation 1 in slot 1, then 2 in slot 0.
            for generation in [1, 2] {
                let sb = Superblock {
                    generation,
                    checkpoint_lsn: Lsn(0),
                    wal_gen: 1,
                    meta: meta_ref,
                    created_unix_ms: created,
                };
                SuperblockFile::write(&*sb_file, &sb)?;
            }
            vfs.sync_dir()?;
        }
        Self::open_with(dir, opts)
    }

    /// Opens an existing store with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(dir, Options::default())
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
                Arc::new(StdVfs::new(dir))
            }
        };
        let process_lock = vfs.lock(!opts.read_only)?;
        let sb_file = SuperblockFile::read(&*vfs, &label)?;
        let segments = Segments::open(vfs.clone(), opts.read_only)?;
        let (sb, meta) = load_newest(&sb_file, &segments)?;
        let fallback = sb_file
            .candidates()?
            .into_iter()
            .find(|c| c.generation < sb.generation);
        let cache = PageCache::new(opts.cache_bytes);
        let views = Arc::new(ViewRegistry::default());

        let mut writer = WriterState {
            catalog: meta.catalog,
            epoch: 1,
            delta: SpaceDelta::default(),
            superseded: Vec::new(),
            refs: RefCounts::from_table(meta.refcounts),
            drop_queue: meta.drop_queue,
            last_lsn: sb.checkpoint_lsn,
            dirty_bytes: 0,
        };
        let replay = replay_wal(
            &*vfs,
            &sb,
            &mut writer,
            Loader {
                cache: &cache,
                segments: &segments,
            },
        )?;
        let wal = Wal::new(vfs.clone(), replay.next_gen, writer.last_lsn, replay.bytes);
        let view = Arc::new(View::new(writer.last_lsn, &writer.catalog, views.clone()));
        let durable = Durable {
            sb,
            fallback,
            sb_file: sb_file.file.clone(),
            usage: meta.usage,
        };
        let needs_heal = !opts.read_only && sb_file.has_invalid_slot();
        let durable_generation = durable.sb.generation;

        let shared = Arc::new(Shared {
            label,
            path: dir.to_path_buf(),
            opts,
            vfs,
            segments,
            cache,
            wal,
            writer: Mutex::new(writer),
            durable: Mutex::new(durable),
            published: RwLock::new(view),
            views,
            pending_deletes: Mutex::new(Vec::new()),
            poisoned: Mutex::new(None),
            keep_pinned: std::sync::atomic::AtomicBool::new(false),
            background: Arc::default(),
            durable_generation: std::sync::atomic::AtomicU64::new(durable_generation),
            bg_thread: Mutex::new(None),
            closed: Mutex::new(false),
            _process_lock: process_lock,
        });
        if !shared.opts.read_only {
            for file in &replay.files {
                file.sync()?;
            }
            shared.segments.sync_all()?;
            let first_live = {
                let d = lock(&shared.durable);
                d.fallback
                    .map_or(d.sb.wal_gen, |f| f.wal_gen.min(d.sb.wal_gen))
            };
            checkpoint::remove_stale_wal(&shared, first_live)?;
            if needs_heal {
                // A torn or corrupt slot is rewritten by the next checkpoint (it is the
                // slot the next generation goes to); do it now.
                checkpoint::run(&shared, None)?;
            }
            if shared.opts.background_checkpoints {
                start_background(&shared);
                if !lock(&shared.writer).drop_queue.is_empty() {
                    shared.wake_background();
                }
            }
        }
        Ok(Store { shared })
    }

    /// The store's directory (or label, for a custom file system).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Starts a write transaction on `main`. Blocks while another one is open.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        self.begin_write_on(crate::catalog::MAIN_BRANCH)
    }

    /// Starts a write transaction on `branch`.
    pub fn begin_write_on(&self, branch: &str) -> Result<WriteTxn<'_>> {
        WriteTxn::begin(&self.shared, branch)
    }

    /// A consistent view of `main`'s committed state.
    pub fn read(&self) -> Result<ReadTxn> {
        self.read_at(crate::catalog::MAIN_BRANCH)
    }

    /// A consistent view of the named version's committed state.
    pub fn read_at(&self, version: &str) -> Result<ReadTxn> {
        ReadTxn::new(self.shared.clone(), self.shared.published(), version)
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

    /// Finishes freeing dropped versions, then writes every dirty node and flips the
    /// superblock; returns when it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.check_writable()?;
        self.finish_drops()?;
        checkpoint::run(&self.shared, None)
    }

    /// Sizes, counts and cache figures.
    pub fn stats(&self) -> Result<Stats> {
        crate::verify::stats(&self.shared)
    }

    /// Checks the durable state on disk and the WAL after it (see [`VerifyReport`]).
    pub fn verify(&self) -> Result<VerifyReport> {
        crate::verify::verify(&self.shared, &mut |_| {})
    }

    /// Like [`Store::verify`], calling `progress` with the bytes checked so far.
    pub fn verify_with_progress(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        crate::verify::verify(&self.shared, progress)
    }

    /// Stops background work and, unless disabled, checkpoints. Other handles to the
    /// same store become unusable for writes.
    pub fn close(self) -> Result<()> {
        self.shared.shutdown()
    }
}

/// Loads the newest superblock whose metadata reads back; falls back to the other slot.
fn load_newest(sb_file: &SuperblockFile, segments: &Segments) -> Result<(Superblock, Meta)> {
    let mut last_err = None;
    for sb in sb_file.candidates()? {
        match segments
            .read(sb.meta, "metadata")
            .and_then(|b| Meta::decode(&b))
        {
            Ok(meta) => return Ok((sb, meta)),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.expect("at least one candidate"))
}

struct Replayed {
    next_gen: u64,
    bytes: u64,
    /// The log files read. What recovery read may still sit only in the OS cache (a
    /// process crash, not a power loss): they are fsynced before new commits build on
    /// what they hold.
    files: Vec<Arc<dyn VFile>>,
}

/// Replays WAL generations from the superblock's on, in order. Each file's records
/// are valid up to its first torn or stale record; LSNs must continue across files.
fn replay_wal(
    vfs: &dyn Vfs,
    sb: &Superblock,
    w: &mut WriterState,
    loader: Loader<'_>,
) -> Result<Replayed> {
    let mut gens: Vec<u64> = vfs
        .list()?
        .iter()
        .filter_map(|n| wal::parse_file_name(n))
        .filter(|&g| g >= sb.wal_gen)
        .collect();
    gens.sort_unstable();
    let mut bytes = 0;
    let mut files = Vec::new();
    for &gen in &gens {
        let file = vfs.open(&wal::file_name(gen))?;
        files.push(file.clone());
        let log = wal::read_log(&*file, gen, w.last_lsn.next())?;
        for (lsn, kind, payload) in log.records {
            if lsn <= w.last_lsn {
                continue; // already in the checkpoint
            }
            if lsn != w.last_lsn.next() {
                // Within a file LSNs are contiguous (`read_log` stops otherwise), so a
                // gap can only open between files: records were lost.
                return Err(Error::corrupted(
                    "wal",
                    format!(
                        "{} continues at LSN {} but LSN {} was expected",
                        wal::file_name(gen),
                        lsn.0,
                        w.last_lsn.next().0
                    ),
                ));
            }
            if kind == wal::KIND_CHECKPOINT_COMMIT {
                return Err(Error::corrupted(
                    "superblock",
                    format!(
                        "LSN {} was committed by a checkpoint newer than the superblock in use \
                         (the newest superblock slot is damaged); recovering would lose it",
                        lsn.0
                    ),
                ));
            }
            match kind {
                wal::KIND_BATCH => {
                    let (branch, ops) = wal::decode_batch(&payload)?;
                    apply_batch(w, loader, VersionId(branch), ops)?;
                }
                wal::KIND_VERSION => {
                    let op = wal::VersionOp::decode(&payload)?;
                    crate::versions::replay(w, loader, op, lsn)?;
                }
                _ => {
                    return Err(Error::corrupted(
                        "wal",
                        format!("unknown record kind {kind} at LSN {}", lsn.0),
                    ))
                }
            }
            w.last_lsn = lsn;
        }
        bytes += log.valid_bytes;
    }
    let next_gen = gens.last().map_or(sb.wal_gen, |g| g + 1);
    Ok(Replayed {
        next_gen,
        bytes,
        files,
    })
}

/// Applies one logged batch to the writer's tree (recovery).
fn apply_batch(
    w: &mut WriterState,
    loader: Loader<'_>,
    branch: VersionId,
    ops: Vec<BatchOp>,
) -> Result<()> {
    let version = w.catalog.by_id_mut(branch).ok_or_else(|| {
        Error::corrupted("wal", format!("batch for unknown version {}", branch.0))
    })?;
    if version.kind != VersionKind::Branch {
        return Err(Error::corrupted("wal", "batch for a read-only version"));
    }
    let mut root: Option<Child> = version.root.take();
    let mut delta = SpaceDelta::default();
    let mut rc = RcDelta::default();
    let mut superseded = Vec::new();
    let mut dirtied = 0;
    let mut ctx = WriteCtx {
        loader,
        epoch: w.epoch,
        delta: &mut delta,
        superseded: &mut superseded,
        dirtied_bytes: &mut dirtied,
        keep_pinned: false,
        refs: &w.refs,
        rc: &mut rc,
    };
    let mut result = Ok(());
    for op in ops {
        let old = match op {
            BatchOp::Put { key, value } => btree::insert(
                &mut root,
                &key,
                crate::btree::node::Value::Inline(value.into()),
                &mut ctx,
            ),
            BatchOp::PutExtent { key, extent } => {
                ctx.delta.alloc(extent);
                btree::insert(
                    &mut root,
                    &key,
                    crate::btree::node::Value::Extent(extent),
                    &mut ctx,
                )
            }
            BatchOp::Delete { key } => btree::delete(&mut root, &key, &mut ctx),
        };
        match old {
            Ok(Some(old)) => ctx.release_value(&old),
            Ok(None) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let version = w.catalog.by_id_mut(branch).expect("looked up above");
    version.root = root;
    w.delta.merge(delta);
    w.refs.apply(rc);
    w.superseded.extend(superseded);
    w.dirty_bytes += dirtied;
    result
}

fn start_background(shared: &Arc<Shared>) {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let signal = shared.background.clone();
    let interval = shared.opts.checkpoint_interval;
    let handle = std::thread::Builder::new()
        .name("cambium-checkpoint".into())
        .spawn(move || background_loop(&weak, &signal, interval));
    if let Ok(h) = handle {
        *lock(&shared.bg_thread) = Some(h);
    }
}

fn background_loop(
    weak: &Weak<Shared>,
    signal: &(Mutex<Background>, Condvar),
    interval: Option<Duration>,
) {
    let (m, cv) = signal;
    loop {
        let wait = interval.unwrap_or(Duration::from_secs(3600));
        let (wanted, drops) = {
            let mut st = lock(m);
            if !st.stop && !st.wanted && !st.drops {
                st = cv
                    .wait_timeout(st, wait)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            if st.stop {
                return;
            }
            (
                std::mem::take(&mut st.wanted),
                std::mem::take(&mut st.drops),
            )
        };
        let Some(shared) = weak.upgrade() else { return };
        if drops {
            // In small steps, so commits interleave; stop early on close.
            loop {
                let stopping = lock(m).stop;
                if stopping || !crate::versions::drop_step(&shared, 64).unwrap_or(false) {
                    break;
                }
            }
        }
        let due = wanted || (interval.is_some() && shared.has_unwritten());
        if due && shared.check_writable().is_ok() {
            // An error poisons the store inside `run`; the thread just carries on idle.
            let _ = checkpoint::run(&shared, None);
        }
    }
}
