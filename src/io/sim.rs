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

use super::{VFile, Vfs};
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
}

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

#[derive(Clone, Default)]
struct FileData {
    durable: Vec<u8>,
    current: Vec<u8>,
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
}

fn power_loss() -> io::Error {
    io::Error::other("simulated power loss")
}

fn injected() -> io::Error {
    io::Error::other("injected I/O error")
}

/// splitmix64: a tiny, good-enough deterministic generator.
#[derive(Clone, Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
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
        let mut by_id: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for id in ns.values() {
            if by_id.contains_key(id) {
                continue;
            }
            let f = &self.files[id];
            let mut content = f.durable.clone();
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
                    Pending::SetLen(len) => content.resize(*len as usize, 0),
                    Pending::Write { offset, data } => {
                        let len = if tear {
                            let sectors = data.len().div_ceil(SECTOR) as u64;
                            // 0..sectors whole sectors survive (never the full write).
                            (rng.below(sectors.max(1)) as usize * SECTOR).min(data.len())
                        } else {
                            data.len()
                        };
                        if len > 0 {
                            apply_write(&mut content, *offset, &data[..len]);
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
                    durable: content.clone(),
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
        Self::from_inner(image)
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
        Self::from_inner(copy)
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
            f.durable[off] ^= xor;
            done = true;
        }
        if off < f.current.len() {
            f.current[off] ^= xor;
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
        f.current = data.to_vec();
        f.durable = data.to_vec();
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
            .map(|id| inner.files[id].current.clone())
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

struct SimFile {
    shared: Arc<Shared>,
    id: u64,
}

impl SimFile {
    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut inner = self.lock_inner();
        inner.mutate()?;
        let f = inner.file(self.id);
        apply_write(&mut f.current, offset, buf);
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
                Pending::SetLen(len) => f.durable.resize(len as usize, 0),
                Pending::Write { offset, data } => apply_write(&mut f.durable, offset, &data),
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
        let f = inner.file(self.id);
        f.current.resize(len as usize, 0);
        f.pending.push(Pending::SetLen(len));
        Ok(())
    }
}

impl Vfs for SimVfs {
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

    fn lock(&self, _exclusive: bool) -> io::Result<Box<dyn Send + Sync>> {
        self.lock_inner().check_alive()?;
        Ok(Box::new(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(f: &Arc<dyn VFile>) -> Vec<u8> {
        let mut buf = vec![0; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    fn content(vfs: &SimVfs, name: &str) -> Option<Vec<u8>> {
        vfs.read_file(name)
    }

    /// A durable file "a" holding `data`.
    fn durable_file(vfs: &SimVfs, data: &[u8]) -> Arc<dyn VFile> {
        let f = vfs.create("a").unwrap();
        f.write_all_at(data, 0).unwrap();
        f.sync().unwrap();
        vfs.sync_dir().unwrap();
        f
    }

    #[test]
    fn reads_see_writes() {
        let vfs = SimVfs::new();
        let f = vfs.create("a").unwrap();
        f.write_all_at(b"hello", 3).unwrap();
        assert_eq!(read_all(&f), b"\0\0\0hello");
        let mut buf = [0u8; 4];
        assert_eq!(
            f.read_exact_at(&mut buf, 6).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        f.set_len(4).unwrap();
        assert_eq!(read_all(&f), b"\0\0\0h");
        assert!(vfs.exists("a").unwrap());
        assert_eq!(
            vfs.create("a").err().unwrap().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(vfs.open("b").err().unwrap().kind(), io::ErrorKind::NotFound);
        let g = vfs.open("a").unwrap();
        assert_eq!(read_all(&g), b"\0\0\0h");
    }

    #[test]
    fn synced_data_survives_every_crash() {
        for seed in 0..200 {
            let vfs = SimVfs::new();
            let f = durable_file(&vfs, &[7u8; 3000]);
            f.write_all_at(&[9u8; 1500], 1000).unwrap();
            f.sync().unwrap();
            let after = vfs.crash(seed);
            let mut expect = vec![7u8; 3000];
            expect[1000..2500].fill(9);
            assert_eq!(content(&after, "a").unwrap(), expect, "seed {seed}");
        }
    }

    #[test]
    fn unsynced_data_can_vanish() {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, b"base");
        f.write_all_at(b"more", 4).unwrap();
        let after = vfs.crash_drop_all();
        assert_eq!(content(&after, "a").unwrap(), b"base");

        // Across seeds, both outcomes occur, and nothing else.
        let (mut kept, mut lost) = (false, false);
        for seed in 0..100 {
            let vfs = SimVfs::new();
            let f = durable_file(&vfs, b"base");
            f.write_all_at(b"more", 4).unwrap();
            match content(&vfs.crash(seed), "a").unwrap().as_slice() {
                b"basemore" => kept = true,
                b"base" => lost = true,
                other => panic!("seed {seed}: unexpected {other:?}"),
            }
        }
        assert!(kept && lost);
    }

    #[test]
    fn torn_write_keeps_a_sector_prefix() {
        let mut lengths = std::collections::BTreeSet::new();
        for seed in 0..300 {
            let vfs = SimVfs::new();
            let f = durable_file(&vfs, &[1u8; 100]);
            let data: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8 + 2).collect();
            f.write_all_at(&data, 100).unwrap();
            let got = content(&vfs.crash(seed), "a").unwrap();
            assert_eq!(&got[..100], &[1u8; 100][..]);
            let kept = got.len() - 100;
            assert!(
                kept == 2000 || kept.is_multiple_of(SECTOR),
                "seed {seed}: kept {kept}"
            );
            assert_eq!(&got[100..], &data[..kept], "seed {seed}");
            lengths.insert(kept);
        }
        // Whole, nothing, and torn prefixes all occur.
        for want in [0, 512, 1024, 1536, 2000] {
            assert!(lengths.contains(&want), "never kept {want}: {lengths:?}");
        }
    }

    #[test]
    fn unsynced_writes_are_independent() {
        // Two unsynced writes to disjoint places: all four combinations occur.
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..400 {
            let vfs = SimVfs::new();
            let f = durable_file(&vfs, &[0u8; 2048]);
            f.write_all_at(&[1u8; 512], 0).unwrap();
            f.write_all_at(&[2u8; 512], 1024).unwrap();
            let got = content(&vfs.crash(seed), "a").unwrap();
            assert_eq!(got.len(), 2048);
            seen.insert((got[0], got[1024]));
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn dir_ops_need_sync_dir() {
        let vfs = SimVfs::new();
        let f = vfs.create("new").unwrap();
        f.write_all_at(b"data", 0).unwrap();
        f.sync().unwrap();
        let after = vfs.crash_drop_all();
        assert!(
            !after.exists("new").unwrap(),
            "undirsynced create must vanish"
        );

        let vfs = SimVfs::new();
        durable_file(&vfs, b"keep");
        vfs.remove("a").unwrap();
        assert!(!vfs.exists("a").unwrap());
        let after = vfs.crash_drop_all();
        assert_eq!(
            content(&after, "a").unwrap(),
            b"keep",
            "undirsynced remove must be undone"
        );

        let vfs = SimVfs::new();
        durable_file(&vfs, b"old");
        let t = vfs.create("tmp").unwrap();
        t.write_all_at(b"new", 0).unwrap();
        t.sync().unwrap();
        vfs.rename("tmp", "a").unwrap();
        assert_eq!(content(&vfs, "a").unwrap(), b"new");
        let after = vfs.crash_drop_all();
        assert_eq!(
            content(&after, "a").unwrap(),
            b"old",
            "undirsynced rename must be undone"
        );
        assert!(!after.exists("tmp").unwrap());

        let vfs = SimVfs::new();
        durable_file(&vfs, b"old");
        let t = vfs.create("tmp").unwrap();
        t.write_all_at(b"new", 0).unwrap();
        t.sync().unwrap();
        vfs.rename("tmp", "a").unwrap();
        vfs.sync_dir().unwrap();
        for seed in 0..50 {
            let v = vfs.fork();
            let after = v.crash(seed);
            assert_eq!(after.names(), vec!["a".to_string()]);
            assert_eq!(content(&after, "a").unwrap(), b"new");
        }
    }

    #[test]
    fn undirsynced_ops_survive_only_as_a_prefix() {
        for seed in 0..200 {
            let vfs = SimVfs::new();
            vfs.sync_dir().unwrap();
            for name in ["x", "y", "z"] {
                let f = vfs.create(name).unwrap();
                f.write_all_at(name.as_bytes(), 0).unwrap();
                f.sync().unwrap();
            }
            let names = vfs.crash(seed).names();
            let all = ["x", "y", "z"];
            assert_eq!(names, all[..names.len()].to_vec(), "seed {seed}");
        }
    }

    #[test]
    fn old_handles_fail_after_crash() {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, b"abc");
        let other = vfs.clone();
        let after = vfs.crash(1);
        let mut buf = [0u8; 1];
        assert!(f.read_exact_at(&mut buf, 0).is_err());
        assert!(f.write_all_at(b"x", 0).is_err());
        assert!(f.sync().is_err());
        assert!(f.len().is_err());
        assert!(f.set_len(0).is_err());
        assert!(other.open("a").is_err());
        assert!(other.create("b").is_err());
        assert!(other.list().is_err());
        assert!(other.exists("a").is_err());
        assert!(other.sync_dir().is_err());
        assert!(other.lock(true).is_err());
        let err = f.sync().unwrap_err();
        assert!(err.to_string().contains("simulated power loss"));
        // The new image is independent and usable.
        let g = after.open("a").unwrap();
        assert_eq!(read_all(&g), b"abc");
        g.write_all_at(b"d", 3).unwrap();
        assert_eq!(read_all(&g), b"abcd");
    }

    #[test]
    fn fault_injection_fires_at_the_right_op() {
        let vfs = SimVfs::new();
        let f = vfs.create("a").unwrap(); // op 0
        assert_eq!(vfs.op_count(), 1);
        vfs.set_fail_after(Some(2));
        f.write_all_at(b"1", 0).unwrap(); // op 1
        f.sync().unwrap(); // op 2
        assert!(f.write_all_at(b"2", 1).is_err()); // op 3: fails
        assert!(f.sync().is_err());
        assert!(vfs.sync_dir().is_err());
        assert!(vfs.create("b").is_err());
        // Reads still work and the failed write had no effect.
        assert_eq!(read_all(&f), b"1");
        assert_eq!(vfs.op_count(), 7);
        vfs.set_fail_after(None);
        f.write_all_at(b"2", 1).unwrap();
        assert_eq!(read_all(&f), b"12");

        vfs.set_fail_once_after(Some(1));
        f.write_all_at(b"3", 2).unwrap();
        assert!(f.write_all_at(b"4", 3).is_err());
        f.write_all_at(b"4", 3).unwrap();
        assert_eq!(read_all(&f), b"1234");
        assert!(f.set_len(0).is_ok());
    }

    #[test]
    fn read_faults() {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, b"abc");
        let mut buf = [0u8; 1];
        vfs.set_read_fail_once_after(Some(1));
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(f.read_exact_at(&mut buf, 0).is_err());
        f.read_exact_at(&mut buf, 0).unwrap();
        vfs.set_read_fail_after(Some(0));
        assert!(f.read_exact_at(&mut buf, 0).is_err());
        assert!(f.write_all_at(b"x", 0).is_ok(), "writes are not affected");
        vfs.set_read_fail_after(None);
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(vfs.read_count(), 5);
    }

    #[test]
    fn corrupt_and_fork() {
        let vfs = SimVfs::new();
        let f = durable_file(&vfs, b"abc");
        let copy = vfs.fork();
        assert!(vfs.corrupt("a", 1, 0xff));
        assert!(!vfs.corrupt("a", 10, 0xff));
        assert!(!vfs.corrupt("zz", 0, 0xff));
        assert_eq!(read_all(&f), [b'a', b'b' ^ 0xff, b'c']);
        assert_eq!(content(&copy, "a").unwrap(), b"abc");
        let after = vfs.crash_drop_all();
        assert_eq!(content(&after, "a").unwrap(), [b'a', b'b' ^ 0xff, b'c']);
        assert_eq!(copy.file_len("a"), Some(3));
        assert_eq!(copy.names(), vec!["a".to_string()]);
    }

    #[test]
    fn crash_is_deterministic() {
        let build = || {
            let vfs = SimVfs::new();
            vfs.sync_dir().unwrap();
            for (i, name) in ["p", "q", "r"].iter().enumerate() {
                let f = vfs.create(name).unwrap();
                for j in 0..5u8 {
                    f.write_all_at(&vec![j + i as u8; 700], j as u64 * 600)
                        .unwrap();
                }
            }
            vfs.sync_dir().unwrap();
            vfs
        };
        for seed in 0..50 {
            let a = build().crash(seed);
            let b = build().crash(seed);
            for n in a.names() {
                assert_eq!(a.read_file(&n), b.read_file(&n), "seed {seed}");
            }
            assert_eq!(a.names(), b.names());
        }
    }

    #[test]
    fn keep_all_crash_equals_current_state() {
        let mut rng = SplitMix(42);
        for round in 0..50 {
            let vfs = SimVfs::new();
            let mut files = Vec::new();
            for name in ["a", "b", "c"] {
                files.push(vfs.create(name).unwrap());
            }
            for _ in 0..40 {
                let f = &files[rng.below(3) as usize];
                match rng.below(10) {
                    0 => f.sync().unwrap(),
                    1 => f.set_len(rng.below(3000)).unwrap(),
                    2 => vfs.sync_dir().unwrap(),
                    _ => {
                        let data = vec![rng.next() as u8; rng.below(1500) as usize];
                        f.write_all_at(&data, rng.below(3000)).unwrap();
                    }
                }
            }
            let before: Vec<_> = vfs.names().iter().map(|n| vfs.read_file(n)).collect();
            let names = vfs.names();
            let after = vfs.crash_keep_all();
            assert_eq!(after.names(), names, "round {round}");
            let got: Vec<_> = names.iter().map(|n| after.read_file(n)).collect();
            assert_eq!(got, before, "round {round}");
        }
    }

    #[test]
    fn threads_share_one_file() {
        let vfs = SimVfs::new();
        let f = vfs.create("a").unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let f = f.clone();
                s.spawn(move || {
                    for i in 0..100u64 {
                        f.write_all_at(&[t], i * 4 + t as u64).unwrap();
                    }
                });
            }
        });
        assert_eq!(f.len().unwrap(), 400);
        let all = read_all(&f);
        for (i, b) in all.iter().enumerate() {
            assert_eq!(*b as usize, i % 4);
        }
    }
}
