//! A simulated, in-memory file system for crash and fault tests.
//!
//! [`SimVfs`] implements [`Vfs`] entirely in memory and models what a power loss
//! can do to a store directory, in the spirit of SQLite's `test6.c` and redb's
//! crash-testing backend:
//!
//! - every file keeps its **durable** bytes (what survives a power loss) and its
//!   **current** bytes (what reads see), plus the writes and `set_len` calls issued
//!   since its last [`VFile::sync`], in order. `sync` makes the current bytes durable;
//! - creations, removals and renames change the current namespace at once but the
//!   durable namespace only at [`Vfs::sync_dir`];
//! - [`SimVfs::crash`] returns a new file system holding one possible post-power-loss
//!   image, chosen deterministically by a seed: synced data is always there, each
//!   unsynced write may be kept or dropped, the last one of a file may be torn at a
//!   512-byte boundary (relative to its start), and directory operations not yet
//!   made durable by `sync_dir` may be lost (a seed-chosen prefix of them, possibly
//!   none, survives, as with an ordered metadata journal);
//! - after a crash the old file system and every handle obtained from it fail every
//!   operation, so a store instance still running cannot touch the new image;
//! - [`SimVfs::set_fail_after`] / [`SimVfs::set_fail_once_after`] inject I/O errors
//!   at the N-th next mutating operation (`write_all_at`, `sync`, `set_len`, `create`,
//!   `remove`, `rename`, `sync_dir`). A failed operation has no effect.
//!   [`SimVfs::set_read_fail_after`] / [`SimVfs::set_read_fail_once_after`] do the
//!   same for `read_exact_at`.
//!
//! Everything is deterministic: no randomness but the crash seed (splitmix64), and
//! files are visited in name order.
//!
//! The file is long (about 700 lines) because the crash model is one concept: the
//! durable and current state of files and namespace, and the functions that move
//! between them must be read together. Its tests are in `sim_tests.rs`.

use super::{LockKind, StoreLock, VFile, Vfs};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// Tearing granularity of an unsynced write that is partially persisted.
pub const SECTOR: usize = 512;

/// The simulated file system. Cloning is cheap and yields a handle to the same
/// file system.
#[derive(Clone)]
pub struct SimVfs {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// What the writer published through its lock. It survives a crash, as `LOCK`
    /// can: it is written only after the sync it reports, so whatever a power loss
    /// keeps of it never names more than the log durably holds, and the strictest
    /// image keeps the newest value (a recovery must then find the log reaching it).
    published: Mutex<Option<u64>>,
    /// A test's code to run before the next write to the file of that name (see
    /// [`SimVfs::before_next_write_to`]).
    before_write: Mutex<Option<(String, WriteHook)>>,
}

type WriteHook = Box<dyn FnOnce() + Send>;

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Clone, Debug)]
enum DirOp {
    Create(String, u64),
    Remove(String),
    Rename(String, String),
}

/// A file's bytes. Shared (`Arc`) so that a fork or a crash image copies only the
/// files written after it, each once, at its first write (`Arc::make_mut`): crash
/// tests that copy a store of hundreds of MiB per crash point stay cheap.
type Bytes = Arc<Vec<u8>>;

#[derive(Clone, Default)]
struct FileData {
    durable: Bytes,
    current: Bytes,
    pending: Vec<Pending>,
    handles: u64,
}

#[derive(Clone, Default)]
struct Inner {
    crashed: bool,
    files: BTreeMap<u64, FileData>,
    current_ns: BTreeMap<String, u64>,
    durable_ns: BTreeMap<String, u64>,
    dir_log: Vec<DirOp>,
    next_id: u64,
    ops: u64,
    fail_from: Option<u64>,
    fail_once_at: Option<u64>,
    reads: u64,
    read_fail_from: Option<u64>,
    read_fail_once_at: Option<u64>,
    /// The disk's size: a write or `set_len` that would take the files past it fails
    /// with `StorageFull` (ENOSPC), as on a full disk.
    capacity: Option<u64>,
    /// [`Vfs::full_disk_patience`]: none unless a test sets it.
    full_disk_patience: std::time::Duration,
}

fn power_loss() -> io::Error {
    io::Error::other("simulated power loss")
}

fn injected() -> io::Error {
    io::Error::other("injected I/O error")
}

/// splitmix64: a tiny, good-enough deterministic generator. Public so that the
/// tests and benchmarks that drive the simulator draw from the same one.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

fn apply_write(buf: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let off = offset as usize;
    let end = off + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[off..end].copy_from_slice(data);
}

/// How a crash treats unsynced writes (chosen from the seed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashMode {
    /// Each unsynced write is kept or dropped independently; the last one of a
    /// file, if kept, may be torn.
    Random,
    /// Every unsynced write is lost.
    DropAll,
    /// Every unsynced write is lost except the last of each file, which is torn.
    DropAllTearLast,
    /// Every unsynced write is kept but the last of each file is torn.
    KeepAllTearLast,
    /// Every unsynced write is kept (as if the power failed just after a sync).
    KeepAll,
}

impl Inner {
    fn check_alive(&self) -> io::Result<()> {
        if self.crashed {
            Err(power_loss())
        } else {
            Ok(())
        }
    }

    /// Accounts for one mutating operation; errors if a fault is armed for it.
    /// Bytes the files take, as on a real disk: those with a name, and removed ones
    /// still open. (A removed file's durable bytes kept for a crash image do not
    /// count: the disk gave them back at the unlink.)
    fn used_bytes(&self) -> u64 {
        let named: std::collections::BTreeSet<u64> = self.current_ns.values().copied().collect();
        self.files
            .iter()
            .filter(|(id, f)| named.contains(id) || f.handles > 0)
            .map(|(_, f)| f.current.len() as u64)
            .sum()
    }

    /// Fails with `StorageFull` if file `id` growing to `new_len` would pass the
    /// capacity.
    fn check_space(&mut self, id: u64, new_len: u64) -> io::Result<()> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        let old_len = self.file(id).current.len() as u64;
        if new_len > old_len && self.used_bytes() + (new_len - old_len) > capacity {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left on device (simulated)",
            ));
        }
        Ok(())
    }

    fn mutate(&mut self) -> io::Result<()> {
        self.check_alive()?;
        let index = self.ops;
        self.ops += 1;
        if self.fail_once_at == Some(index) {
            self.fail_once_at = None;
            return Err(injected());
        }
        if let Some(from) = self.fail_from {
            if index >= from {
                return Err(injected());
            }
        }
        Ok(())
    }

    /// Accounts for one read; errors if a read fault is armed for it.
    fn read_op(&mut self) -> io::Result<()> {
        self.check_alive()?;
        let index = self.reads;
        self.reads += 1;
        if self.read_fail_once_at == Some(index) {
            self.read_fail_once_at = None;
            return Err(injected());
        }
        if self.read_fail_from.is_some_and(|from| index >= from) {
            return Err(injected());
        }
        Ok(())
    }

    fn file(&mut self, id: u64) -> &mut FileData {
        self.files
            .get_mut(&id)
            .expect("SimVfs: handle to an unknown file")
    }

    /// Forgets files no name (current or durable) and no handle refers to.
    fn gc(&mut self) {
        let live: std::collections::BTreeSet<u64> = self
            .current_ns
            .values()
            .chain(self.durable_ns.values())
            .copied()
            .chain(self.dir_log.iter().filter_map(|op| match op {
                DirOp::Create(_, id) => Some(*id),
                _ => None,
            }))
            .collect();
        self.files
            .retain(|id, f| f.handles > 0 || live.contains(id));
    }

    fn post_crash(&self, rng: &mut SplitMix, mode: CrashMode) -> Inner {
        // Namespace: the durable one plus a prefix of the unsynced directory ops.
        let keep_ops = match mode {
            CrashMode::DropAll => 0,
            CrashMode::KeepAll => self.dir_log.len(),
            _ => {
                if rng.chance(1, 2) {
                    0
                } else {
                    rng.below(self.dir_log.len() as u64 + 1) as usize
                }
            }
        };
        let mut ns = self.durable_ns.clone();
        for op in &self.dir_log[..keep_ops] {
            match op {
                DirOp::Create(name, id) => {
                    ns.insert(name.clone(), *id);
                }
                DirOp::Remove(name) => {
                    ns.remove(name);
                }
                DirOp::Rename(from, to) => {
                    if let Some(id) = ns.remove(from) {
                        ns.insert(to.clone(), id);
                    }
                }
            }
        }
        // Content: for each surviving file (visited in name order, each identity
        // once), its durable bytes plus a seed-chosen selection of unsynced writes.
        let mut by_id: BTreeMap<u64, Bytes> = BTreeMap::new();
        for id in ns.values() {
            if by_id.contains_key(id) {
                continue;
            }
            let f = &self.files[id];
            let mut content = Arc::clone(&f.durable);
            let last_write = f
                .pending
                .iter()
                .rposition(|p| matches!(p, Pending::Write { .. }));
            for (i, p) in f.pending.iter().enumerate() {
                let is_last = Some(i) == last_write;
                let (keep, tear) = match mode {
                    CrashMode::Random => {
                        let keep = rng.chance(1, 2);
                        (keep, keep && is_last && rng.chance(1, 2))
                    }
                    CrashMode::DropAll => (false, false),
                    CrashMode::DropAllTearLast => (is_last, is_last),
                    CrashMode::KeepAllTearLast => (true, is_last),
                    CrashMode::KeepAll => (true, false),
                };
                if !keep {
                    continue;
                }
                match p {
                    Pending::SetLen(len) => Arc::make_mut(&mut content).resize(*len as usize, 0),
                    Pending::Write { offset, data } => {
                        let len = if tear {
                            let sectors = data.len().div_ceil(SECTOR) as u64;
                            // 0..sectors whole sectors survive (never the full write).
                            (rng.below(sectors.max(1)) as usize * SECTOR).min(data.len())
                        } else {
                            data.len()
                        };
                        if len > 0 {
                            apply_write(Arc::make_mut(&mut content), *offset, &data[..len]);
                        }
                    }
                }
            }
            by_id.insert(*id, content);
        }
        let mut out = Inner {
            next_id: self.next_id,
            ..Inner::default()
        };
        for (id, content) in by_id {
            out.files.insert(
                id,
                FileData {
                    durable: Arc::clone(&content),
                    current: content,
                    pending: Vec::new(),
                    handles: 0,
                },
            );
        }
        out.current_ns = ns.clone();
        out.durable_ns = ns;
        out
    }
}

impl Default for SimVfs {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SimVfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock_inner();
        f.debug_struct("SimVfs")
            .field("crashed", &inner.crashed)
            .field("files", &inner.current_ns.keys().collect::<Vec<_>>())
            .field("ops", &inner.ops)
            .finish()
    }
}

impl SimVfs {
    /// An empty file system.
    pub fn new() -> Self {
        Self::from_inner(Inner::default())
    }

    fn from_inner(inner: Inner) -> Self {
        SimVfs {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                published: Mutex::new(None),
                before_write: Mutex::new(None),
            }),
        }
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn crash_with(&self, rng: &mut SplitMix, mode: CrashMode) -> SimVfs {
        let mut inner = self.lock_inner();
        assert!(
            !inner.crashed,
            "SimVfs: crash() on a file system that already crashed"
        );
        let image = inner.post_crash(rng, mode);
        inner.crashed = true;
        // Free the old image's memory; handles only need `crashed`.
        inner.files.clear();
        inner.current_ns.clear();
        inner.durable_ns.clear();
        inner.dir_log.clear();
        drop(inner);
        self.with_published(Self::from_inner(image))
    }

    /// `image` with what this file system's writer published (see `published`).
    fn with_published(&self, image: SimVfs) -> SimVfs {
        let published = *self
            .shared
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *image
            .shared
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = published;
        image
    }

    /// Simulates a power loss: returns a new file system holding one post-crash
    /// image chosen by `seed`, and makes this one (and every handle from it) fail
    /// every further operation with "simulated power loss".
    ///
    /// The seed picks one of several modes: independent keep/drop of each unsynced
    /// write with the last one possibly torn (half of the seeds); drop every
    /// unsynced write; drop every unsynced write but keep a torn prefix of the last
    /// one of each file; keep all unsynced writes but tear the last; keep all.
    /// Unsynced directory operations survive as a seed-chosen prefix (often none).
    pub fn crash(&self, seed: u64) -> SimVfs {
        let mut rng = SplitMix(seed ^ 0x5EED_C0DE_D00D_F00D);
        let mode = match rng.below(10) {
            0..=4 => CrashMode::Random,
            5 => CrashMode::DropAll,
            6 | 7 => CrashMode::DropAllTearLast,
            8 => CrashMode::KeepAllTearLast,
            _ => CrashMode::KeepAll,
        };
        self.crash_with(&mut rng, mode)
    }

    /// Simulates a power loss in which every unsynced write and every directory
    /// operation not made durable by `sync_dir` is lost.
    pub fn crash_drop_all(&self) -> SimVfs {
        self.crash_with(&mut SplitMix(0), CrashMode::DropAll)
    }

    /// Simulates a power loss in which nothing unsynced is lost (equivalent to a
    /// process kill; the page cache survives). The old file system is killed too.
    pub fn crash_keep_all(&self) -> SimVfs {
        self.crash_with(&mut SplitMix(0), CrashMode::KeepAll)
    }

    /// An independent deep copy of the current state (no crash; both stay usable).
    /// Pending writes are carried over, so a later crash of the copy behaves like a
    /// crash of the original would have.
    pub fn fork(&self) -> SimVfs {
        let inner = self.lock_inner();
        assert!(!inner.crashed, "SimVfs: fork() of a crashed file system");
        let mut copy = inner.clone();
        for f in copy.files.values_mut() {
            f.handles = 0;
        }
        copy.ops = 0;
        copy.fail_from = None;
        copy.fail_once_at = None;
        copy.reads = 0;
        copy.read_fail_from = None;
        copy.read_fail_once_at = None;
        copy.gc();
        drop(inner);
        self.with_published(Self::from_inner(copy))
    }

    /// Runs `hook` once, just before the next write to the file named `name` (on
    /// the writing thread, with no lock of the file system held): a test's way to
    /// put its own operation, or a fault, at one point inside the engine's work.
    pub fn before_next_write_to(&self, name: &str, hook: impl FnOnce() + Send + 'static) {
        *self.shared.lock_hook() = Some((name.to_owned(), Box::new(hook)));
    }

    /// Whether this file system has been crashed (then every operation fails).
    pub fn is_crashed(&self) -> bool {
        self.lock_inner().crashed
    }

    /// After `ops` more mutating operations, every mutating operation fails
    /// (a persistent fault); `None` disarms.
    pub fn set_fail_after(&self, ops: Option<u64>) {
        let mut inner = self.lock_inner();
        inner.fail_from = ops.map(|n| inner.ops + n);
    }

    /// The mutating operation after `ops` more of them fails once (a transient
    /// fault); `None` disarms.
    pub fn set_fail_once_after(&self, ops: Option<u64>) {
        let mut inner = self.lock_inner();
        inner.fail_once_at = ops.map(|n| inner.ops + n);
    }

    /// After `reads` more `read_exact_at` calls, every read fails (a persistent
    /// read fault); `None` disarms.
    pub fn set_read_fail_after(&self, reads: Option<u64>) {
        let mut inner = self.lock_inner();
        inner.read_fail_from = reads.map(|n| inner.reads + n);
    }

    /// The read after `reads` more of them fails once; `None` disarms.
    pub fn set_read_fail_once_after(&self, reads: Option<u64>) {
        let mut inner = self.lock_inner();
        inner.read_fail_once_at = reads.map(|n| inner.reads + n);
    }

    /// Makes the disk `bytes` large (`None`: unlimited): writes that would take the
    /// files past it fail with `StorageFull`.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.lock_inner().capacity = bytes;
    }

    /// Sets [`Vfs::full_disk_patience`] (none by default).
    pub fn set_full_disk_patience(&self, patience: std::time::Duration) {
        self.lock_inner().full_disk_patience = patience;
    }

    /// Bytes the files take now.
    pub fn used_bytes(&self) -> u64 {
        self.lock_inner().used_bytes()
    }

    /// `read_exact_at` calls so far (failed ones included).
    pub fn read_count(&self) -> u64 {
        self.lock_inner().reads
    }

    /// Mutating operations attempted so far (failed ones included).
    pub fn op_count(&self) -> u64 {
        self.lock_inner().ops
    }

    /// XORs the byte at `offset` of file `name` with `xor`, in both the durable and
    /// the current content. Returns false (and does nothing) if the file does not
    /// exist or is too short in both.
    pub fn corrupt(&self, name: &str, offset: u64, xor: u8) -> bool {
        let mut inner = self.lock_inner();
        let Some(&id) = inner.current_ns.get(name) else {
            return false;
        };
        let f = inner.file(id);
        let off = offset as usize;
        let mut done = false;
        if off < f.durable.len() {
            Arc::make_mut(&mut f.durable)[off] ^= xor;
            done = true;
        }
        if off < f.current.len() {
            Arc::make_mut(&mut f.current)[off] ^= xor;
            done = true;
        }
        done
    }

    /// Overwrites (or creates) file `name` with `data`, durably, namespace included.
    pub fn write_file(&self, name: &str, data: &[u8]) {
        let mut inner = self.lock_inner();
        let id = match inner.current_ns.get(name) {
            Some(&id) => id,
            None => {
                let id = inner.next_id;
                inner.next_id += 1;
                inner.files.insert(id, FileData::default());
                inner.current_ns.insert(name.to_owned(), id);
                id
            }
        };
        inner.durable_ns.insert(name.to_owned(), id);
        let f = inner.file(id);
        f.current = Arc::new(data.to_vec());
        f.durable = Arc::clone(&f.current);
        f.pending.clear();
    }

    /// The current length of file `name`.
    pub fn file_len(&self, name: &str) -> Option<u64> {
        let inner = self.lock_inner();
        inner
            .current_ns
            .get(name)
            .map(|id| inner.files[id].current.len() as u64)
    }

    /// The current content of file `name`.
    pub fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        let inner = self.lock_inner();
        inner
            .current_ns
            .get(name)
            .map(|id| inner.files[id].current.to_vec())
    }

    /// The names of the files currently in the directory, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock_inner().current_ns.keys().cloned().collect()
    }

    /// Unsynced writes and `set_len` calls pending on file `name`.
    pub fn pending_ops(&self, name: &str) -> Option<usize> {
        let inner = self.lock_inner();
        inner
            .current_ns
            .get(name)
            .map(|id| inner.files[id].pending.len())
    }

    fn handle(&self, id: u64) -> Arc<dyn VFile> {
        Arc::new(SimFile {
            shared: self.shared.clone(),
            id,
        })
    }
}

/// A lock on the simulated store (no exclusion between processes: tests open one
/// store at a time); the writer's publishes what readers may replay.
struct SimLock(Arc<Shared>);

impl StoreLock for SimLock {
    fn publish_synced(&self, lsn: u64) -> io::Result<()> {
        *self.0.published.lock().unwrap_or_else(|e| e.into_inner()) = Some(lsn);
        Ok(())
    }
}

struct SimFile {
    shared: Arc<Shared>,
    id: u64,
}

impl SimFile {
    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the write hook if it waits for this file (lock order: hook, then inner).
    fn run_write_hook(&self) {
        let mut hook = self.shared.lock_hook();
        let Some((name, _)) = hook.as_ref() else {
            return;
        };
        if self.lock_inner().current_ns.get(name) != Some(&self.id) {
            return;
        }
        let Some((_, run)) = hook.take() else { return };
        drop(hook);
        run();
    }
}

impl Shared {
    fn lock_hook(&self) -> MutexGuard<'_, Option<(String, WriteHook)>> {
        self.before_write.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut inner = self.lock_inner();
        if inner.crashed {
            return;
        }
        if let Some(f) = inner.files.get_mut(&self.id) {
            f.handles -= 1;
            if f.handles == 0 {
                inner.gc();
            }
        }
    }
}

impl VFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.read_op()?;
        let f = inner.file(self.id);
        let start = offset as usize;
        let end = start
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::other("offset overflow"))?;
        if end > f.current.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            ));
        }
        buf.copy_from_slice(&f.current[start..end]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.run_write_hook();
        let mut inner = self.lock_inner();
        inner.mutate()?;
        inner.check_space(self.id, offset + buf.len() as u64)?;
        let f = inner.file(self.id);
        apply_write(Arc::make_mut(&mut f.current), offset, buf);
        f.pending.push(Pending::Write {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.mutate()?;
        let f = inner.file(self.id);
        // Replaying the pending operations onto the durable bytes costs only what
        // was written since the last sync (copying `current` would cost the whole,
        // possibly preallocated, file at every fsync).
        for p in std::mem::take(&mut f.pending) {
            match p {
                Pending::SetLen(len) => Arc::make_mut(&mut f.durable).resize(len as usize, 0),
                Pending::Write { offset, data } => {
                    apply_write(Arc::make_mut(&mut f.durable), offset, &data)
                }
            }
        }
        debug_assert!(
            f.durable == f.current,
            "durable + pending must equal current"
        );
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let mut inner = self.lock_inner();
        inner.check_alive()?;
        Ok(inner.file(self.id).current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.mutate()?;
        inner.check_space(self.id, len)?;
        let f = inner.file(self.id);
        Arc::make_mut(&mut f.current).resize(len as usize, 0);
        f.pending.push(Pending::SetLen(len));
        Ok(())
    }
}

impl Vfs for SimVfs {
    /// No other process reads a simulated file system.
    fn readers_present(&self) -> bool {
        false
    }

    fn full_disk_patience(&self) -> std::time::Duration {
        self.lock_inner().full_disk_patience
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        let mut inner = self.lock_inner();
        inner.check_alive()?;
        let Some(&id) = inner.current_ns.get(name) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no file {name}"),
            ));
        };
        inner.file(id).handles += 1;
        Ok(self.handle(id))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn VFile>> {
        let mut inner = self.lock_inner();
        inner.check_alive()?;
        if inner.current_ns.contains_key(name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{name} exists"),
            ));
        }
        inner.mutate()?;
        let id = inner.next_id;
        inner.next_id += 1;
        inner.files.insert(
            id,
            FileData {
                handles: 1,
                ..FileData::default()
            },
        );
        inner.current_ns.insert(name.to_owned(), id);
        inner.dir_log.push(DirOp::Create(name.to_owned(), id));
        Ok(self.handle(id))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.check_alive()?;
        if !inner.current_ns.contains_key(name) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no file {name}"),
            ));
        }
        inner.mutate()?;
        inner.current_ns.remove(name);
        inner.dir_log.push(DirOp::Remove(name.to_owned()));
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.check_alive()?;
        if !inner.current_ns.contains_key(from) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no file {from}"),
            ));
        }
        inner.mutate()?;
        if from == to {
            return Ok(());
        }
        let id = inner.current_ns.remove(from).expect("checked above");
        inner.current_ns.insert(to.to_owned(), id);
        inner
            .dir_log
            .push(DirOp::Rename(from.to_owned(), to.to_owned()));
        Ok(())
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        let inner = self.lock_inner();
        inner.check_alive()?;
        Ok(inner.current_ns.contains_key(name))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let inner = self.lock_inner();
        inner.check_alive()?;
        Ok(inner.current_ns.keys().cloned().collect())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut inner = self.lock_inner();
        inner.mutate()?;
        inner.durable_ns = inner.current_ns.clone();
        inner.dir_log.clear();
        inner.gc();
        Ok(())
    }

    /// A new writer keeps what the last one published, as `LOCK` does.
    fn lock(&self, _kind: LockKind) -> io::Result<Box<dyn StoreLock>> {
        self.lock_inner().check_alive()?;
        Ok(Box::new(SimLock(self.shared.clone())))
    }

    fn published_synced(&self) -> Option<u64> {
        *self
            .shared
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn free_bytes(&self) -> Option<u64> {
        let inner = self.lock_inner();
        Some(inner.capacity?.saturating_sub(inner.used_bytes()))
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
