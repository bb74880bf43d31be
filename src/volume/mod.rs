//! Thin block volumes: a volume is a branch whose keys are block numbers and whose
//! values are the blocks (DESIGN.md, "Volumes are trees"; paper 000 §5.7).
//!
//! A block that was never written, was trimmed, or was written with zeroes has no
//! key: it reads as zeroes and takes no space. A block of 4 KiB (any block above
//! 1 KiB) is written once, at `put`, as an extent of its own at the tail of the
//! active segment; only its reference goes through the WAL and the tree. Snapshot
//! and clone of a volume are the store's snapshot and branch, so they cost O(1) and
//! share every block until one side writes it; dropping a volume frees what only it
//! referenced; the cleaner moves its blocks like any other extent, by back
//! references.
//!
//! The tree holds one more key, the header (size and block size), so that a
//! snapshot keeps the geometry it had (`header.rs`).
//!
//! ```
//! # fn main() -> cambium::Result<()> {
//! use cambium::volume::Volume;
//! use cambium::Durability;
//! let dir = tempfile::tempdir()?;
//! let store = cambium::Store::create(dir.path())?;
//! let disk = Volume::create(&store, "disk", 1 << 20, 4096)?;
//! disk.write_at(8192, b"hello", Durability::Immediate)?;
//! Volume::snapshot(&store, "disk", "disk.1")?;
//! disk.write_at(8192, b"HELLO", Durability::Immediate)?;
//!
//! let mut buf = [0u8; 5];
//! Volume::open(&store, "disk.1")?.read_at(8192, &mut buf)?;
//! assert_eq!(&buf, b"hello");
//! assert_eq!(disk.allocated_bytes()?, 4096); // one block; the rest are holes
//! # Ok(()) }
//! ```

mod blocks;
pub mod export;
mod fill;
mod header;

pub use fill::FillError;
pub use header::{DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE, MAX_VOLUME_SIZE, MIN_BLOCK_SIZE};

use crate::catalog::VersionKind;
use crate::error::{Error, Result};
use crate::format::BlockRef;
use crate::limits::INLINE_VALUE_MAX;
use crate::options::Durability;
use crate::store::Store;
use crate::txn::{ReadTxn, WriteTxn};
use blocks::{block_key, block_of, is_zero, pieces, BlockKey, Piece};
use header::{check_size, Header, HEADER_KEY};
use serde::Serialize;
use std::borrow::Cow;
use std::time::Instant;

/// How many blocks one `allocation` call visits at most.
const ALLOCATION_KEYS_MAX: u32 = 1 << 16;

/// How many keys a range delete (trim, write-zeroes, shrink) removes per step.
const DELETE_STEP_KEYS: usize = 4096;

/// Checks a volume geometry: `block_size` a power of two from 512 B to 1 MiB, and
/// `size_bytes` a positive multiple of it, at most [`MAX_VOLUME_SIZE`].
pub fn check_geometry(size_bytes: u64, block_size: u32) -> Result<()> {
    Header::new(size_bytes, block_size).map(|_| ())
}

/// A handle on one volume (a branch, or a read-only snapshot). Cheap; any number
/// may be open on one volume, in any threads.
#[derive(Clone, Debug)]
pub struct Volume {
    store: Store,
    name: String,
    /// The version the handle was opened on: the name may be dropped and reused by
    /// another volume while the handle lives (an NBD connection outlives a `volume
    /// drop`), and the handle must then fail, not write into the newcomer.
    version_id: u32,
    header: Header,
    kind: VersionKind,
}

/// Blocks written to disk by [`Volume::write_ahead`], not yet part of the volume.
/// Dropped without [`WrittenAhead::commit`], they never are (dead space).
#[must_use = "the blocks are not in the volume until committed"]
pub struct WrittenAhead<'v> {
    volume: &'v Volume,
    keys: Vec<BlockKey>,
    extents: Vec<BlockRef>,
    /// Keeps their segment from being deleted before the commit names them.
    _pin: crate::space::Pin<'v>,
}

impl WrittenAhead<'_> {
    /// Maps the blocks in, as one transaction (a snapshot asked for meanwhile may
    /// land between two of them, as for [`Volume::write_many`]); durable on return
    /// under [`Durability::Immediate`].
    pub fn commit(self, durability: Durability) -> Result<()> {
        let pairs: Vec<(&[u8], BlockRef)> = self
            .keys
            .iter()
            .zip(&self.extents)
            .map(|(k, r)| (&k[..], *r))
            .collect();
        self.volume.put_written_yielding(&pairs, durability)
    }
}

impl std::fmt::Debug for WrittenAhead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrittenAhead")
            .field("volume", &self.volume.name())
            .field("blocks", &self.keys.len())
            .finish_non_exhaustive()
    }
}

/// A run of a volume's address space, as [`Volume::allocation`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its length in bytes.
    pub len: u64,
    /// Whether its blocks are stored (false: a hole, which reads as zeroes).
    pub allocated: bool,
}

/// One volume, as [`Volume::list`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VolumeInfo {
    /// Its name (a version's name).
    pub name: String,
    /// Whether it is a read-only snapshot.
    pub snapshot: bool,
    /// The version it was made from, if that still exists.
    pub parent: Option<String>,
    /// Its size: the bytes a client sees.
    pub size_bytes: u64,
    /// The same, under the name thin provisioning gives it: bytes promised, whether
    /// stored or not.
    pub provisioned_bytes: u64,
    /// Its block size.
    pub block_size: u32,
    /// Bytes of blocks stored (blocks written and not trimmed or zeroed).
    pub allocated_bytes: u64,
    /// Bytes only this volume references (blocks and tree nodes): what dropping it
    /// would free.
    pub exclusive_bytes: u64,
    /// Bytes it references that other versions reference too.
    pub shared_bytes: u64,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// An import is filling it, or was and was cut short ([`Volume::is_incomplete`]).
    pub incomplete: bool,
}

/// Volumes an import is filling in this process, by store directory and name.
static FILLING: std::sync::Mutex<Vec<(std::path::PathBuf, String)>> =
    std::sync::Mutex::new(Vec::new());

fn filling() -> std::sync::MutexGuard<'static, Vec<(std::path::PathBuf, String)>> {
    FILLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A volume being filled ([`Volume::create_filling`]), for as long as this lives.
pub struct Filling {
    dir: std::path::PathBuf,
    name: String,
}

impl Drop for Filling {
    fn drop(&mut self) {
        let mut all = filling();
        if let Some(i) = all
            .iter()
            .position(|(d, n)| *d == self.dir && *n == self.name)
        {
            all.swap_remove(i);
        }
    }
}

impl Volume {
    /// [`Volume::create`] for a volume about to be filled (an image imported), which
    /// is [incomplete](Volume::is_incomplete) until [`Volume::complete`]: not
    /// exported, so that no client reads half an image or writes into one still
    /// being copied in, and marked so for good if the import is cut short. The
    /// remains of such an import under `name` (incomplete, and not being filled in
    /// this process) are dropped first, so the import can simply be run again.
    pub fn create_filling(
        store: &Store,
        name: &str,
        size_bytes: u64,
        block_size: u32,
    ) -> Result<(Volume, Filling)> {
        let dir = store.path().to_path_buf();
        {
            // Marked first, under the lock of the marks: there is no moment when the
            // new volume exists unmarked, and two imports of one name in this
            // process cannot both take the other's for remains.
            let mut marks = filling();
            if marks.iter().any(|(d, n)| *d == dir && n == name) {
                return Err(Error::VersionExists(name.to_owned()));
            }
            marks.push((dir.clone(), name.to_owned()));
        }
        let mark = Filling {
            dir,
            name: name.to_owned(),
        };
        // Only a writable volume (what an import makes) is such remains: a snapshot
        // under the name is the user's, whatever it holds.
        if Volume::open(store, name).is_ok_and(|v| v.is_incomplete() && !v.is_read_only()) {
            store.drop_version(name)?;
        }
        let header = Header {
            incomplete: true,
            ..Header::new(size_bytes, block_size)?
        };
        let volume = Volume::create_with(store, name, header)?;
        Ok((volume, mark))
    }

    /// Marks a volume made by [`Volume::create_filling`] whole: the image is in.
    /// Makes every write before it durable first, then the mark (durable on return).
    pub fn complete(&mut self) -> Result<()> {
        self.sync()?;
        let header = Header {
            incomplete: false,
            ..self.header
        };
        let mut txn = self.begin(Durability::Immediate)?;
        txn.put(HEADER_KEY, &header.encode())?;
        txn.commit()?;
        self.header = header;
        Ok(())
    }

    /// Whether an import is filling volume `name` (in this process, or it was
    /// and was cut short): such a volume is not exported.
    pub fn is_filling(store: &Store, name: &str) -> bool {
        let here = filling()
            .iter()
            .any(|(d, n)| d == store.path() && n == name);
        here || Volume::open(store, name).is_ok_and(|v| v.is_incomplete())
    }

    /// Whether an import is filling it, or was and was cut short (the process
    /// killed): its blocks are not the whole image.
    pub fn is_incomplete(&self) -> bool {
        self.header.incomplete
    }

    /// `InvalidArgument` if the volume is [incomplete](Volume::is_incomplete): what
    /// refuses to copy, export or resize half an image, which would pass for a whole
    /// one (or, resized, undo or break the import filling it).
    pub fn check_complete(&self) -> Result<()> {
        if self.is_incomplete() {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is incomplete (an import is filling it, or was cut short): \
                 import it again, or drop it",
                self.name
            )));
        }
        Ok(())
    }

    /// Makes a new, empty volume `name` of `size_bytes` (a positive multiple of
    /// `block_size`, a power of two from 512 B to 1 MiB). Durable on return.
    pub fn create(store: &Store, name: &str, size_bytes: u64, block_size: u32) -> Result<Volume> {
        Volume::create_with(store, name, Header::new(size_bytes, block_size)?)
    }

    fn create_with(store: &Store, name: &str, header: Header) -> Result<Volume> {
        // Two records, one fsync: a crash between them leaves an empty branch that
        // is not a volume (no header), which `volume list` does not show.
        store.create_branch_with(name, Durability::Deferred)?;
        let mut txn = store.begin_write_on(name)?;
        let version_id = txn.version_id();
        txn.put(HEADER_KEY, &header.encode())?;
        txn.commit()?;
        Ok(Volume {
            store: store.clone(),
            name: name.to_owned(),
            version_id,
            header,
            kind: VersionKind::Branch,
        })
    }

    /// Opens volume `name`: [`Error::VolumeNotFound`] if there is no such version or
    /// it is not a volume.
    pub fn open(store: &Store, name: &str) -> Result<Volume> {
        let kind = store.version_kind(name).map_err(|e| gone(name, e))?;
        let read = store.read_at(name).map_err(|e| gone(name, e))?;
        let header = read
            .get_with(HEADER_KEY, |b| Header::decode(name, b))?
            .ok_or_else(|| Error::VolumeNotFound(name.to_owned()))??;
        Ok(Volume {
            store: store.clone(),
            name: name.to_owned(),
            version_id: read.version_id(),
            header,
            kind,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size in bytes, as of when this handle was opened (or last resized).
    pub fn size(&self) -> u64 {
        self.header.size_bytes
    }

    /// Its block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.header.block_size
    }

    /// Whether it is a snapshot (writes fail with [`Error::ReadOnly`]).
    pub fn is_read_only(&self) -> bool {
        self.kind == VersionKind::Snapshot
    }

    /// The store it lives in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Fills `buf` from `offset`; holes read as zeroes.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let read = self.view()?;
        let bs = self.header.block_size as usize;
        let mut ps = pieces(offset, buf.len(), self.header.block_size);
        if let (Some(p), None) = (ps.next(), ps.next()) {
            // One block: a point lookup.
            let dst = &mut buf[p.at..p.at + p.len];
            let found = read.get_with(&block_key(p.block), |b| copy_piece(b, bs, &p, dst))?;
            return match found {
                Some(r) => r,
                None => {
                    dst.fill(0);
                    Ok(())
                }
            };
        }
        buf.fill(0);
        let first = offset / bs as u64;
        let end = (offset + buf.len() as u64).div_ceil(bs as u64);
        let (lo, hi) = (block_key(first), block_key(end));
        let mut iter = read.range(&lo[..]..&hi[..])?;
        while let Some(entry) = iter.next_ref() {
            let (key, value) = entry?;
            let block = block_of(key).ok_or_else(|| self.bad_key(key))?;
            if let Some(p) = piece_of(offset, buf.len(), bs, block) {
                copy_piece(value, bs, &p, &mut buf[p.at..p.at + p.len])?;
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset`, in one atomic transaction. All-zero blocks become
    /// holes. `Durability::Deferred` returns once the write is visible (an NBD write
    /// without FUA); it becomes durable at the next [`Volume::sync`].
    pub fn write_at(&self, offset: u64, data: &[u8], durability: Durability) -> Result<()> {
        self.write_many(&[(offset, data)], durability)
    }

    /// Writes each `(offset, data)` in order (a later write wins where two
    /// overlap), in one transaction: what an NBD server does with the writes a
    /// client has in flight at once, at the cost of one commit. A snapshot or clone
    /// asked for meanwhile may land between two blocks of it (see
    /// `put_written_yielding`): none of these writes has returned yet, so, as
    /// with a power cut, it may hold any of them, or part of one.
    pub fn write_many(&self, writes: &[(u64, &[u8])], durability: Durability) -> Result<()> {
        // The common case (whole blocks of data): the blocks go to their segment
        // before the transaction takes the writer lock, which then covers only the
        // mappings (see `write_values_pinned`). Every range is checked either way.
        if let Some(written) = self.write_many_ahead(writes)? {
            return written.commit(durability);
        }
        let mut txn = self.begin(durability)?;
        let bs = self.header.block_size as usize;
        // Blocks to store wait here to go out together (one segment write), in
        // order; anything that must see them (a partial block's read, a delete)
        // sends them first.
        let mut pending = Pending::default();
        for &(offset, data) in writes {
            for p in pieces(offset, data.len(), self.header.block_size) {
                let src = &data[p.at..p.at + p.len];
                let key = block_key(p.block);
                if p.is_whole(bs) && !is_zero(src) {
                    pending.push_borrowed(key, data, p.at..p.at + p.len);
                    continue;
                }
                put_pending(&mut txn, &mut pending)?;
                if p.is_whole(bs) {
                    txn.delete(&key)?;
                    continue;
                }
                let mut block = Vec::new();
                self.read_block(&txn, &key, &mut block)?;
                block[p.within..p.within + p.len].copy_from_slice(src);
                if is_zero(&block) {
                    txn.delete(&key)?;
                } else {
                    pending.push_owned(key, block);
                }
            }
        }
        put_pending(&mut txn, &mut pending)?;
        txn.commit()
    }

    /// Maps `pairs` in one transaction, or in several when a version operation asks
    /// for the writer lock meanwhile: a batch of 32 writes just after a snapshot
    /// copies leaves and adds a parent to each of their hundreds of extents, and
    /// takes up to several milliseconds, while a snapshot of a busy volume is
    /// promised in under one. None of the batch's writes has been answered, so the
    /// snapshot may fall between its parts; the parts but the last commit with
    /// deferred durability (the last one's covers them).
    fn put_written_yielding(
        &self,
        pairs: &[(&[u8], BlockRef)],
        durability: Durability,
    ) -> Result<()> {
        let mut txn = self.begin(durability)?;
        let waiting = || self.store.version_op_waiting();
        let mut done = 0;
        loop {
            done += txn.put_written_until(&pairs[done..], &waiting)?;
            if done == pairs.len() {
                return txn.commit();
            }
            txn.set_durability(Durability::Deferred);
            txn.commit()?;
            self.store.let_version_ops_in();
            txn = self.begin(durability)?;
        }
    }

    /// The first half of [`Volume::write_at`], for a caller that overlaps one write's
    /// commit with the next one's data (an NBD server's stream of large writes): the
    /// blocks of `data` go to disk now, out of sight, and [`WrittenAhead::commit`]
    /// maps them in, as one transaction. `None` if `data` is not all whole blocks of
    /// data (a partial block is read first, a block of zeroes is a hole): write it
    /// with [`Volume::write_at`] then. A crash before the commit leaves the volume
    /// as it was; the blocks written are dead space.
    pub fn write_ahead(&self, offset: u64, data: &[u8]) -> Result<Option<WrittenAhead<'_>>> {
        self.write_many_ahead(&[(offset, data)])
    }

    /// [`Volume::write_ahead`] of several pieces at once, in order (a later one wins
    /// where two overlap, as in [`Volume::write_many`]): their blocks go out as one
    /// append and one commit maps them all. Checks every range first; `None` if not
    /// every piece is whole blocks of data. A single piece goes to disk from where
    /// it lies, if aligned for a direct write.
    fn write_many_ahead(&self, writes: &[(u64, &[u8])]) -> Result<Option<WrittenAhead<'_>>> {
        for &(offset, data) in writes {
            self.check_range(offset, data.len() as u64)?;
        }
        let run = match writes {
            [(_, data)] => Some(*data),
            _ => None,
        };
        match self.whole_blocks(writes) {
            Some(blocks) => self.write_blocks_ahead(blocks, run).map(Some),
            None => Ok(None),
        }
    }

    /// Writes `blocks` to a data segment. `run` may be their bytes back to back in
    /// memory: if aligned for a direct write (an NBD landing's are), they go to disk
    /// from there.
    fn write_blocks_ahead(
        &self,
        blocks: Vec<(BlockKey, &[u8])>,
        run: Option<&[u8]>,
    ) -> Result<WrittenAhead<'_>> {
        let values: Vec<&[u8]> = blocks.iter().map(|(_, v)| *v).collect();
        let (extents, pin) = self.store.write_values_pinned(&values, run)?;
        Ok(WrittenAhead {
            volume: self,
            keys: blocks.into_iter().map(|(k, _)| k).collect(),
            extents,
            _pin: pin,
        })
    }

    /// The blocks of `writes` with their keys, if every piece is a whole block, none
    /// all zeroes, and blocks are stored out of line (over 1 KiB): what
    /// [`Volume::write_many`] writes ahead of its transaction.
    fn whole_blocks<'d>(&self, writes: &[(u64, &'d [u8])]) -> Option<Vec<(BlockKey, &'d [u8])>> {
        let bs = self.header.block_size as usize;
        let total: usize = writes.iter().map(|(_, d)| d.len()).sum();
        // A snapshot's handle takes the ordinary path, which refuses before writing.
        if self.is_read_only() || bs <= INLINE_VALUE_MAX || total == 0 {
            return None;
        }
        let mut blocks = Vec::with_capacity(total / bs);
        for &(offset, data) in writes {
            for p in pieces(offset, data.len(), self.header.block_size) {
                let src = &data[p.at..p.at + p.len];
                if !p.is_whole(bs) || is_zero(src) {
                    return None;
                }
                blocks.push((block_key(p.block), src));
            }
        }
        Some(blocks)
    }

    /// Makes `len` bytes from `offset` read as zeroes: whole blocks become holes
    /// (taking no space), partial ones are rewritten.
    pub fn write_zeroes(&self, offset: u64, len: u64, durability: Durability) -> Result<()> {
        self.discard(offset, len, durability, true)
    }

    /// Discards the whole blocks within `len` bytes from `offset` (they become holes
    /// and read as zeroes); the parts of partial blocks at either end are kept, as
    /// TRIM allows.
    pub fn trim(&self, offset: u64, len: u64, durability: Durability) -> Result<()> {
        self.discard(offset, len, durability, false)
    }

    /// The allocation of `len` bytes from `offset`, as runs in order covering at
    /// least the first block and at most `max_runs` runs; they may stop short of
    /// `len` (ask again from where they end).
    pub fn allocation(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<Run>> {
        self.check_range(offset, len)?;
        let bs = u64::from(self.header.block_size);
        let end = offset + len;
        let read = self.view()?;
        let (lo, hi) = (block_key(offset / bs), block_key(end.div_ceil(bs)));
        let max_runs = max_runs.max(1);
        let mut runs: Vec<Run> = Vec::new();
        let mut pos = offset;
        let mut keys = read.range(&lo[..]..&hi[..])?.keys();
        // A run of allocated blocks can be long: stop after this many keys and
        // answer what was found (the caller asks again from where the runs end).
        let mut budget = ALLOCATION_KEYS_MAX;
        while pos < end {
            let Some(key) = keys.next_ref() else {
                push_run(&mut runs, max_runs, end - pos, false);
                break;
            };
            let key = key?;
            let block = block_of(key).ok_or_else(|| self.bad_key(key))?;
            // The first block may start before `offset`; every block starts before `end`.
            let start = (block * bs).max(pos);
            if start > pos && !push_run(&mut runs, max_runs, start - pos, false) {
                break;
            }
            pos = start;
            let block_end = ((block + 1) * bs).min(end);
            if !push_run(&mut runs, max_runs, block_end - pos, true) {
                break;
            }
            pos = block_end;
            budget -= 1;
            if budget == 0 {
                break;
            }
        }
        Ok(runs)
    }

    /// Calls `f` with the offset and bytes of every stored block, in order (holes are
    /// skipped): what an export of the volume writes.
    pub fn for_each_block(&self, mut f: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let read = self.view()?;
        let bs = self.header.block_size as usize;
        let (lo, hi) = (block_key(0), block_key(self.header.blocks()));
        let mut iter = read.range(&lo[..]..&hi[..])?;
        while let Some(entry) = iter.next_ref() {
            let (key, block) = entry?;
            let index = block_of(key).ok_or_else(|| self.bad_key(key))?;
            if block.len() != bs {
                return Err(Error::corrupted(
                    "volume",
                    format!("{}: block {index} holds {} bytes", self.name, block.len()),
                ));
            }
            f(index * bs as u64, block)?;
        }
        Ok(())
    }

    /// Checks the volume's keys against its header without reading a block: every
    /// key after the header names a block inside the volume and holds exactly a
    /// block's bytes. Returns the problems found (the store's `verify` checks the
    /// blocks' checksums; this checks what only the volume layer knows).
    pub fn check(&self) -> Result<Vec<String>> {
        let read = self.view()?;
        let mut problems = Vec::new();
        let mut iter = read.range(&[0x01u8][..]..)?;
        while let Some(entry) = iter.next_key_and_len() {
            let (key, len) = entry?;
            let problem = match block_of(key) {
                None => Some(format!("a key of {} bytes that names no block", key.len())),
                Some(b) if b >= self.header.blocks() => Some(format!(
                    "block {b} lies past the end ({} blocks)",
                    self.header.blocks()
                )),
                Some(b) if len != self.header.block_size as usize => Some(format!(
                    "block {b} holds {len} bytes, not {}",
                    self.header.block_size
                )),
                Some(_) => None,
            };
            if let Some(p) = problem {
                problems.push(format!("volume {:?}: {p}", self.name));
                if problems.len() >= 100 {
                    problems.push(format!(
                        "volume {:?}: (stopped after 100 problems)",
                        self.name
                    ));
                    break;
                }
            }
        }
        Ok(problems)
    }

    /// Bytes of blocks stored.
    pub fn allocated_bytes(&self) -> Result<u64> {
        let read = self.view()?;
        let (lo, hi) = (block_key(0), block_key(self.header.blocks()));
        let blocks = read.count(&lo[..]..&hi[..])?;
        Ok(blocks * u64::from(self.header.block_size))
    }

    /// Makes every write committed so far durable (an NBD flush).
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    /// Changes the size. Shrinking drops the blocks past the new end, so growing
    /// again later reads zeroes there. Durable on return.
    pub fn resize(&mut self, size_bytes: u64) -> Result<()> {
        check_size(size_bytes, self.header.block_size)?;
        let header = Header {
            incomplete: self.header.incomplete,
            ..Header::new(size_bytes, self.header.block_size)?
        };
        let mut txn = self.begin(Durability::Immediate)?;
        let (lo, hi) = (block_key(header.blocks()), block_key(u64::MAX));
        delete_keys(&mut txn, &lo, &hi)?;
        txn.put(HEADER_KEY, &header.encode())?;
        txn.commit()?;
        self.header = header;
        Ok(())
    }

    /// Makes a read-only snapshot `name` of volume `source`, in constant time.
    /// Durable on return.
    pub fn snapshot(store: &Store, source: &str, name: &str) -> Result<Volume> {
        Volume::snapshot_with(store, source, name, Durability::Immediate)
    }

    /// [`Volume::snapshot`] with a choice of durability: `Deferred` returns as soon
    /// as the snapshot exists (it holds every write committed before it, and writers
    /// wait only while its catalog record is appended); [`Volume::sync`] then makes
    /// it durable without holding anyone up.
    pub fn snapshot_with(
        store: &Store,
        source: &str,
        name: &str,
        durability: Durability,
    ) -> Result<Volume> {
        Volume::snapshot_timed(store, source, name, durability).map(|(vol, _)| vol)
    }

    /// Makes a writable clone `name` of volume `source` (a volume or a snapshot of
    /// one), in constant time. Durable on return.
    pub fn clone_volume(store: &Store, source: &str, name: &str) -> Result<Volume> {
        Volume::clone_with(store, source, name, Durability::Immediate)
    }

    /// [`Volume::clone_volume`] with a choice of durability (see
    /// [`Volume::snapshot_with`]).
    pub fn clone_with(
        store: &Store,
        source: &str,
        name: &str,
        durability: Durability,
    ) -> Result<Volume> {
        Volume::clone_timed(store, source, name, durability).map(|(vol, _)| vol)
    }

    /// [`Volume::snapshot_with`], also returning the moment the snapshot came to
    /// exist: made under the writer lock, holding every write committed before it.
    /// What writers may have waited for ends there; making it durable comes after,
    /// and so, on a busy machine, may this thread's next turn on a CPU. `cambium
    /// volume snapshot` reports the time from the call to this moment.
    pub fn snapshot_timed(
        store: &Store,
        source: &str,
        name: &str,
        durability: Durability,
    ) -> Result<(Volume, Instant)> {
        Volume::copy_timed(store, source, name, VersionKind::Snapshot, durability)
    }

    /// [`Volume::clone_with`], also returning the moment the clone came to exist
    /// (see [`Volume::snapshot_timed`]).
    pub fn clone_timed(
        store: &Store,
        source: &str,
        name: &str,
        durability: Durability,
    ) -> Result<(Volume, Instant)> {
        Volume::copy_timed(store, source, name, VersionKind::Branch, durability)
    }

    /// A snapshot or clone of volume `source` (checked to be a volume first), and
    /// when it came to exist.
    fn copy_timed(
        store: &Store,
        source: &str,
        name: &str,
        kind: VersionKind,
        durability: Durability,
    ) -> Result<(Volume, Instant)> {
        // A copy of half an image would look whole to whoever uses it.
        Volume::open(store, source)?.check_complete()?;
        let made = store.copy_version(source, name, kind, durability)?;
        Ok((Volume::open(store, name)?, made))
    }

    /// Removes volume `name`; its space comes back as for any dropped version.
    pub fn drop_volume(store: &Store, name: &str) -> Result<()> {
        Volume::open(store, name)?;
        store.drop_version(name)
    }

    /// Drops the volume this handle was opened on, if its name still names it (not
    /// another volume made under the same name since, after a `volume drop`): what
    /// an import cut short does with the volume it was filling.
    /// `VolumeNotFound` if it is gone.
    pub fn drop_this(self) -> Result<()> {
        match self
            .store
            .drop_version_if(&self.name, Some(self.version_id))
        {
            Err(Error::VersionNotFound(_)) => Err(Error::VolumeNotFound(self.name)),
            other => other,
        }
    }

    /// Every volume (and volume snapshot) in the store, in the order they were made,
    /// with its space. Walks the store's versions for the space figures.
    pub fn list(store: &Store) -> Result<Vec<VolumeInfo>> {
        let mut out = Vec::new();
        for v in store.versions()? {
            let vol = match Volume::open(store, &v.name) {
                Ok(vol) => vol,
                Err(Error::VolumeNotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            out.push(VolumeInfo {
                allocated_bytes: vol.allocated_bytes()?,
                snapshot: vol.is_read_only(),
                parent: v.parent,
                size_bytes: vol.size(),
                provisioned_bytes: vol.size(),
                block_size: vol.block_size(),
                exclusive_bytes: v.exclusive_bytes,
                shared_bytes: v.referenced_bytes.saturating_sub(v.exclusive_bytes),
                created_unix_ms: v.created_unix_ms,
                incomplete: vol.is_incomplete(),
                name: v.name,
            });
        }
        Ok(out)
    }

    /// Whether the version `name` is a volume (or a volume's snapshot): its keys are
    /// block addresses, written through [`Volume`] only. `false` for a version that
    /// is not there.
    pub fn is_volume(store: &Store, name: &str) -> Result<bool> {
        match store.read_at(name) {
            Ok(read) => read.contains_key(HEADER_KEY),
            Err(Error::VersionNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The names of the volumes and volume snapshots, with whether each is a
    /// snapshot: cheap (no space accounting).
    pub fn names(store: &Store) -> Result<Vec<(String, bool)>> {
        let mut out = Vec::new();
        for (name, kind) in store.version_names() {
            match store.read_at(&name) {
                Ok(read) if read.contains_key(HEADER_KEY)? => {
                    out.push((name, kind == VersionKind::Snapshot));
                }
                // Dropped since the names were read.
                Ok(_) | Err(Error::VersionNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// A view of this volume's committed state.
    fn view(&self) -> Result<ReadTxn> {
        let read = self
            .store
            .read_at(&self.name)
            .map_err(|e| gone(&self.name, e))?;
        if read.version_id() != self.version_id {
            return Err(Error::VolumeNotFound(self.name.clone()));
        }
        Ok(read)
    }

    fn begin(&self, durability: Durability) -> Result<WriteTxn<'_>> {
        let mut txn = self
            .store
            .begin_write_on(&self.name)
            .map_err(|e| gone(&self.name, e))?;
        if txn.version_id() != self.version_id {
            return Err(Error::VolumeNotFound(self.name.clone()));
        }
        txn.set_durability(durability);
        // The size may have changed since this handle was opened: a write past
        // the current end would leave blocks a later grow would expose.
        let current = txn
            .get_with(HEADER_KEY, |b| Header::decode(&self.name, b))?
            .ok_or_else(|| Error::VolumeNotFound(self.name.clone()))??;
        if current.size_bytes < self.header.size_bytes {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} shrank to {} bytes since it was opened",
                self.name, current.size_bytes
            )));
        }
        Ok(txn)
    }

    fn discard(&self, offset: u64, len: u64, durability: Durability, zero: bool) -> Result<()> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = u64::from(self.header.block_size);
        let end = offset + len;
        let (first_whole, end_whole) = (offset.div_ceil(bs), end / bs);
        let mut txn = self.begin(durability)?;
        if zero {
            // The partial blocks at either end: rewrite them with their part zeroed.
            let mut scratch = Vec::new();
            let head = (offset, (first_whole * bs).min(end));
            let tail = ((end_whole * bs).max(offset), end);
            // Within one block the two are the same piece.
            let parts = if head == tail {
                vec![head]
            } else {
                vec![head, tail]
            };
            for (from, to) in parts {
                if from < to {
                    let key = block_key(from / bs);
                    self.read_block(&txn, &key, &mut scratch)?;
                    let within = (from % bs) as usize;
                    scratch[within..within + (to - from) as usize].fill(0);
                    put_block(&mut txn, &key, &scratch)?;
                }
            }
        }
        if first_whole < end_whole {
            delete_keys(&mut txn, &block_key(first_whole), &block_key(end_whole))?;
        }
        txn.commit()
    }

    /// Reads block `key` as `txn` sees it into `scratch` (zeroes for a hole).
    fn read_block(&self, txn: &WriteTxn<'_>, key: &[u8], scratch: &mut Vec<u8>) -> Result<()> {
        let bs = self.header.block_size as usize;
        scratch.clear();
        scratch.resize(bs, 0);
        let whole = Piece {
            block: 0,
            within: 0,
            at: 0,
            len: bs,
        };
        match txn.get_with(key, |b| copy_piece(b, bs, &whole, scratch))? {
            Some(r) => r,
            None => Ok(()),
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.header.size_bytes => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} go past the end of volume {:?} ({} bytes)",
                self.name, self.header.size_bytes
            ))),
        }
    }

    fn bad_key(&self, key: &[u8]) -> Error {
        Error::corrupted(
            "volume",
            format!(
                "{}: a key of {} bytes among the blocks",
                self.name,
                key.len()
            ),
        )
    }
}

/// `VolumeNotFound` for a version that is not there (any more).
fn gone(name: &str, e: Error) -> Error {
    match e {
        Error::VersionNotFound(_) => Error::VolumeNotFound(name.to_owned()),
        e => e,
    }
}

/// Stores one whole block: a hole if it is all zeroes.
fn put_block(txn: &mut WriteTxn<'_>, key: &[u8], block: &[u8]) -> Result<()> {
    if is_zero(block) {
        txn.delete(key)?;
        Ok(())
    } else {
        txn.put(key, block)
    }
}

/// Blocks waiting to go out together, in order, and whether they are one run of a
/// write's payload (so the segment write can go out from the payload itself).
#[derive(Default)]
struct Pending<'d> {
    blocks: Vec<(BlockKey, Cow<'d, [u8]>)>,
    /// The payload and the range of it the blocks cover, while they are all
    /// consecutive slices of one payload.
    run: Option<(&'d [u8], std::ops::Range<usize>)>,
}

impl<'d> Pending<'d> {
    /// Adds `data[range]`, a whole block of a write's payload.
    fn push_borrowed(&mut self, key: BlockKey, data: &'d [u8], range: std::ops::Range<usize>) {
        let extends = match &mut self.run {
            Some((d, r)) if std::ptr::eq(*d, data) && r.end == range.start => {
                r.end = range.end;
                true
            }
            _ => false,
        };
        if !extends {
            self.run = self.blocks.is_empty().then(|| (data, range.clone()));
        }
        self.blocks.push((key, Cow::Borrowed(&data[range])));
    }

    /// Adds a block made here (a merged partial block).
    fn push_owned(&mut self, key: BlockKey, block: Vec<u8>) {
        self.run = None;
        self.blocks.push((key, Cow::Owned(block)));
    }
}

/// Puts the blocks waiting in `pending`, in order, in one segment write.
fn put_pending(txn: &mut WriteTxn<'_>, pending: &mut Pending<'_>) -> Result<()> {
    if pending.blocks.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(&[u8], &[u8])> = pending
        .blocks
        .iter()
        .map(|(k, v)| (&k[..], &v[..]))
        .collect();
    let run = pending.run.as_ref().map(|(data, r)| &data[r.clone()]);
    txn.put_many_from(&pairs, run)?;
    pending.blocks.clear();
    pending.run = None;
    Ok(())
}

/// Deletes every key in `[lo, hi)`, visiting only keys that are there.
fn delete_keys(txn: &mut WriteTxn<'_>, lo: &[u8], hi: &[u8]) -> Result<()> {
    loop {
        let keys = txn.keys_in(lo, hi, DELETE_STEP_KEYS)?;
        for key in &keys {
            txn.delete(key)?;
        }
        if keys.len() < DELETE_STEP_KEYS {
            return Ok(());
        }
    }
}

/// Copies piece `p` of a stored block into `dst`; a stored block of the wrong size
/// is corruption.
fn copy_piece(block: &[u8], block_size: usize, p: &Piece, dst: &mut [u8]) -> Result<()> {
    if block.len() != block_size {
        return Err(Error::corrupted(
            "volume",
            format!("a block of {} bytes, not {block_size}", block.len()),
        ));
    }
    dst.copy_from_slice(&block[p.within..p.within + p.len]);
    Ok(())
}

/// Block `block`'s piece of the byte range, if it has one.
fn piece_of(offset: u64, len: usize, block_size: usize, block: u64) -> Option<Piece> {
    let bs = block_size as u64;
    let (start, end) = (block * bs, (block + 1) * bs);
    let (from, to) = (start.max(offset), end.min(offset + len as u64));
    (from < to).then(|| Piece {
        block,
        within: (from - start) as usize,
        at: (from - offset) as usize,
        len: (to - from) as usize,
    })
}

/// Extends the last run, or starts a new one if there are fewer than `max_runs`;
/// false when the run did not fit.
fn push_run(runs: &mut Vec<Run>, max_runs: usize, len: u64, allocated: bool) -> bool {
    if let Some(last) = runs.last_mut().filter(|last| last.allocated == allocated) {
        last.len += len;
    } else if runs.len() < max_runs {
        runs.push(Run { len, allocated });
    } else {
        return false;
    }
    true
}

#[cfg(test)]
mod export_tests;
#[cfg(test)]
mod tests;
