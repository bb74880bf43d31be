//! Deferred edits: how a large transaction inserts in key order.
//!
//! A transaction edits a copy-on-write tree and, once its dirty nodes pass
//! `Options::txn_dirty_bytes`, spills them (`super::spill`). Random keys into a tree
//! much larger than that budget defeat the spill: each insert lands in a leaf not
//! touched since the last spill, so every spill rewrites about a budget's worth of
//! leaves to add a budget's worth of *entries* to them, some 20 times fewer bytes,
//! and an appending store keeps every superseded copy until it is cleaned. Measured
//! (12M random pairs of 24 + 150 bytes in one transaction, 128 MiB budget, the default
//! in a 1 GiB container): 60 GB written before the disk filled.
//!
//! So once a transaction has spilled and its keys have come out of order, its puts
//! and deletes stop editing the tree. They go into a sorted [`Deferred`] buffer; a
//! full buffer is written out as a sorted **run** to a temporary file; at commit the
//! runs and the buffer are merged (a newer edit of a key wins) and applied to the
//! tree in key order, so each leaf is edited, and spilled, once: an external merge
//! sort, the batching of a Bε-tree's buffers (BetrFS) taken to the whole
//! transaction. A load in key order never gets here: it fills leaves one after
//! another and spills each once already.
//!
//! Reads in the transaction see its deferred edits: the buffer first, then the runs
//! newest first, then the tree. A delete looks the key up the same way (it reports
//! whether the key was there) and is buffered as a tombstone.
//!
//! Run files (`txn-<n>.run` in the store directory) live only as long as their
//! transaction: nothing durable names them, they are never synced, and a writable
//! open removes any a crash left behind ([`remove_stale_runs`]). Each holds blocks
//! of about [`BLOCK_BYTES`], each framed by its length and CRC-32C (a damaged run
//! fails the transaction with a corruption error, never a wrong value), and the
//! transaction keeps every block's first key in memory, to find a key's block with
//! one read, and a Bloom filter of the run's keys, so that a lookup of a key a run
//! does not hold (a delete's, most often) reads nothing from it.

use crate::error::{Error, Result};
use crate::format::{put_u16, put_u32, put_u8, BlockRef, Decoder};
use crate::io::{VFile, Vfs};
use std::collections::btree_map;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The target size of a run's block: one `pread` for a lookup, and the unit of a
/// merge's reads.
pub(crate) const BLOCK_BYTES: usize = 16 << 10;

/// Bits of a run's Bloom filter per key, and probes per lookup: about 1% false
/// positives.
const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_PROBES: u64 = 7;

/// Bytes of a block's frame: the length of its entries (u32), their CRC-32C (u32).
const FRAME: usize = 8;

/// A run is written in writes of about this size.
const WRITE_BYTES: usize = 1 << 20;

/// What a buffered entry costs beyond its key and value: the map's node share, two
/// allocations' headers, the tag. An estimate; the budget is approximate anyway.
const ENTRY_OVERHEAD: u64 = 64;

const TAG_PUT: u8 = 0;
const TAG_EXTENT: u8 = 1;
const TAG_DELETE: u8 = 2;

const RUN_PREFIX: &str = "txn-";
const RUN_SUFFIX: &str = ".run";

/// Run files get names unique in this process; a crashed process's are removed by
/// the next writable open, before any transaction.
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// A deferred edit of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Edit {
    /// Insert or replace with an inline value.
    Put(Box<[u8]>),
    /// Insert or replace with a value already written to its own extent.
    Extent(BlockRef),
    /// Remove.
    Delete,
}

/// An [`Edit`] borrowed from a buffer or a run's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EditRef<'a> {
    Put(&'a [u8]),
    Extent(BlockRef),
    Delete,
}

impl Edit {
    fn as_ref(&self) -> EditRef<'_> {
        match self {
            Edit::Put(v) => EditRef::Put(v),
            Edit::Extent(r) => EditRef::Extent(*r),
            Edit::Delete => EditRef::Delete,
        }
    }
}

impl EditRef<'_> {
    pub(crate) fn to_owned(self) -> Edit {
        match self {
            EditRef::Put(v) => Edit::Put(v.into()),
            EditRef::Extent(r) => Edit::Extent(r),
            EditRef::Delete => Edit::Delete,
        }
    }
}

/// A large transaction's edits not yet applied to its tree: a sorted buffer in
/// memory and the sorted runs written before it (module docs).
pub(crate) struct Deferred {
    vfs: Arc<dyn Vfs>,
    buffer: BTreeMap<Box<[u8]>, Edit>,
    /// About the memory `buffer` takes ([`ENTRY_OVERHEAD`] per entry).
    buffer_bytes: u64,
    /// Past this, the buffer is written out as a run.
    budget: u64,
    /// Oldest first.
    runs: Vec<Run>,
}

impl Deferred {
    pub(crate) fn new(vfs: Arc<dyn Vfs>, budget: u64) -> Deferred {
        Deferred {
            vfs,
            buffer: BTreeMap::new(),
            buffer_bytes: 0,
            budget,
            runs: Vec::new(),
        }
    }

    /// Records `edit` of `key`, replacing any earlier one; writes the buffer out as a
    /// run once it passes its budget.
    pub(crate) fn push(&mut self, key: &[u8], edit: Edit) -> Result<()> {
        self.buffer_bytes += key.len() as u64
            + ENTRY_OVERHEAD
            + match &edit {
                Edit::Put(v) => v.len() as u64,
                Edit::Extent(_) => BlockRef::SIZE as u64,
                Edit::Delete => 0,
            };
        self.buffer.insert(key.into(), edit);
        if self.buffer_bytes > self.budget {
            self.write_run()?;
        }
        Ok(())
    }

    /// The newest deferred edit of `key`, if any.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Edit>> {
        if let Some(e) = self.buffer.get(key) {
            return Ok(Some(e.clone()));
        }
        let hash = key_hash(key);
        for run in self.runs.iter().rev() {
            if !run.bloom.may_contain(hash) {
                continue;
            }
            if let Some(e) = run.get(key)? {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Readies the edits for [`Deferred::merged_from`] at commit: once there are runs
    /// the buffer joins them on disk, so that the tree being edited has the memory
    /// the buffer held.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if self.runs.is_empty() {
            Ok(())
        } else {
            self.write_run()
        }
    }

    /// Runs written so far.
    #[cfg(test)]
    pub(crate) fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Every deferred edit at or after `start`, newest per key, in key order: the
    /// buffer and the runs merged.
    pub(crate) fn merged_from(&self, start: &[u8]) -> Result<Merge<'_>> {
        let mut sources = Vec::with_capacity(self.runs.len() + 1);
        for run in &self.runs {
            sources.push(Source::Run(RunCursor::seek(run, start)?));
        }
        let mut iter = self
            .buffer
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded));
        let cur = iter.next().map(|(k, e)| (&**k, e));
        sources.push(Source::Buffer(BufferCursor { iter, cur }));
        Ok(Merge {
            sources,
            key: Vec::new(),
        })
    }

    /// Writes the buffer out as a new run and empties it.
    fn write_run(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let name = format!(
            "{RUN_PREFIX}{:08}{RUN_SUFFIX}",
            NEXT_RUN.fetch_add(1, Ordering::Relaxed)
        );
        let file = self.vfs.create(&name)?;
        // From here the run is removed on drop, also if writing it fails.
        self.runs.push(Run {
            vfs: Arc::clone(&self.vfs),
            file,
            name,
            index: Vec::new(),
            bloom: Bloom::for_keys(self.buffer.len()),
        });
        let run = self.runs.last_mut().expect("just pushed");
        let mut out = Vec::with_capacity(WRITE_BYTES + BLOCK_BYTES);
        let mut at = 0u64;
        let mut block = Vec::with_capacity(BLOCK_BYTES + 2048);
        let mut first_key: Option<Box<[u8]>> = None;
        let mut entries = std::mem::take(&mut self.buffer).into_iter().peekable();
        while let Some((key, edit)) = entries.next() {
            if first_key.is_none() {
                first_key = Some(key.clone());
            }
            run.bloom.insert(key_hash(&key));
            encode_entry(&key, edit.as_ref(), &mut block);
            if block.len() >= BLOCK_BYTES || entries.peek().is_none() {
                let len = u32::try_from(block.len()).expect("a block is far below 4 GiB");
                run.index.push(BlockIndex {
                    first_key: first_key.take().expect("a block has an entry"),
                    at: at + out.len() as u64,
                    len,
                });
                put_u32(&mut out, len);
                put_u32(&mut out, crc32c::crc32c(&block));
                out.extend_from_slice(&block);
                block.clear();
                if out.len() >= WRITE_BYTES || entries.peek().is_none() {
                    run.file.write_all_at(&out, at)?;
                    at += out.len() as u64;
                    out.clear();
                }
            }
        }
        self.buffer_bytes = 0;
        Ok(())
    }
}

/// One sorted run: its file and the first key of each of its blocks.
struct Run {
    vfs: Arc<dyn Vfs>,
    file: Arc<dyn VFile>,
    name: String,
    index: Vec<BlockIndex>,
    bloom: Bloom,
}

struct BlockIndex {
    first_key: Box<[u8]>,
    at: u64,
    /// Bytes of entries (the frame not included).
    len: u32,
}

impl Drop for Run {
    fn drop(&mut self) {
        // Best effort: a file left behind is removed by the next writable open.
        let _ = self.vfs.remove(&self.name);
    }
}

impl Run {
    /// Reads and checks block `i`'s entries.
    fn block(&self, i: usize) -> Result<Vec<u8>> {
        let b = self.index.get(i).expect("a block the index lists");
        let mut buf = vec![0u8; FRAME + b.len as usize];
        self.file.read_exact_at(&mut buf, b.at)?;
        let mut d = Decoder::new(&buf, "transaction run block");
        let (len, crc) = (d.u32()?, d.u32()?);
        let entries = d.bytes(d.remaining())?;
        if len != b.len || crc32c::crc32c(entries) != crc {
            return Err(Error::corrupted(
                "transaction run block",
                format!(
                    "{} at byte {}: length or checksum mismatch",
                    self.name, b.at
                ),
            ));
        }
        buf.drain(..FRAME);
        Ok(buf)
    }

    /// The block that holds `key` if any does: the last whose first key is `<= key`.
    fn block_of(&self, key: &[u8]) -> Option<usize> {
        self.index
            .partition_point(|b| &*b.first_key <= key)
            .checked_sub(1)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Edit>> {
        let Some(i) = self.block_of(key) else {
            return Ok(None);
        };
        let block = self.block(i)?;
        let mut d = Decoder::new(&block, "transaction run entry");
        while d.remaining() > 0 {
            let (k, edit) = decode_entry(&mut d)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(Some(edit.to_owned())),
                std::cmp::Ordering::Greater => break,
            }
        }
        Ok(None)
    }
}

/// A position in a run: the block it reads and its current entry, decoded.
struct RunCursor<'r> {
    run: &'r Run,
    /// The block `block` holds; past the last when the cursor is done.
    block_no: usize,
    block: Vec<u8>,
    /// The current entry, `None` once past the last.
    cur: Option<Entry>,
}

/// An entry of a block, by its offsets there.
struct Entry {
    key: std::ops::Range<usize>,
    edit: EntryEdit,
    /// Where the next entry starts.
    end: usize,
}

enum EntryEdit {
    Put(std::ops::Range<usize>),
    Extent(BlockRef),
    Delete,
}

impl<'r> RunCursor<'r> {
    /// A cursor at the first entry at or after `start`.
    fn seek(run: &'r Run, start: &[u8]) -> Result<RunCursor<'r>> {
        let mut c = RunCursor {
            run,
            block_no: run.block_of(start).unwrap_or(0),
            block: Vec::new(),
            cur: None,
        };
        c.load()?;
        while matches!(c.current(), Some((k, _)) if k < start) {
            c.advance()?;
        }
        Ok(c)
    }

    /// Loads block `block_no` (if there is one) and stands at its first entry.
    fn load(&mut self) -> Result<()> {
        self.block = if self.block_no < self.run.index.len() {
            self.run.block(self.block_no)?
        } else {
            Vec::new()
        };
        self.decode_at(0)
    }

    /// Decodes the entry at offset `pos` of the block (none at its end).
    fn decode_at(&mut self, pos: usize) -> Result<()> {
        let rest = self.block.get(pos..).unwrap_or_default();
        if rest.is_empty() {
            self.cur = None;
            return Ok(());
        }
        let mut d = Decoder::new(rest, "transaction run entry");
        let (key, edit) = decode_entry(&mut d)?;
        // Offsets of the borrowed slices within the block.
        let base = self.block.as_ptr() as usize;
        let range = |s: &[u8]| {
            let from = s.as_ptr() as usize - base;
            from..from + s.len()
        };
        self.cur = Some(Entry {
            key: range(key),
            edit: match edit {
                EditRef::Put(v) => EntryEdit::Put(range(v)),
                EditRef::Extent(r) => EntryEdit::Extent(r),
                EditRef::Delete => EntryEdit::Delete,
            },
            end: pos + (rest.len() - d.remaining()),
        });
        Ok(())
    }

    fn current(&self) -> Option<(&[u8], EditRef<'_>)> {
        let e = self.cur.as_ref()?;
        // The ranges were taken from slices of `block`, which has not changed since.
        let slice = |r: &std::ops::Range<usize>| self.block.get(r.clone()).unwrap_or_default();
        let edit = match &e.edit {
            EntryEdit::Put(v) => EditRef::Put(slice(v)),
            EntryEdit::Extent(r) => EditRef::Extent(*r),
            EntryEdit::Delete => EditRef::Delete,
        };
        Some((slice(&e.key), edit))
    }

    fn advance(&mut self) -> Result<()> {
        let Some(e) = &self.cur else { return Ok(()) };
        let end = e.end;
        if end >= self.block.len() {
            self.block_no += 1;
            self.load()
        } else {
            self.decode_at(end)
        }
    }
}

/// The in-memory buffer as a [`Merge`] input.
struct BufferCursor<'a> {
    iter: btree_map::Range<'a, Box<[u8]>, Edit>,
    cur: Option<(&'a [u8], &'a Edit)>,
}

/// One input of a [`Merge`].
enum Source<'a> {
    Run(RunCursor<'a>),
    Buffer(BufferCursor<'a>),
}

impl Source<'_> {
    fn current(&self) -> Option<(&[u8], EditRef<'_>)> {
        match self {
            Source::Run(c) => c.current(),
            Source::Buffer(b) => b.cur.map(|(k, e)| (k, e.as_ref())),
        }
    }

    fn advance(&mut self) -> Result<()> {
        match self {
            Source::Run(c) => c.advance(),
            Source::Buffer(b) => {
                b.cur = b.iter.next().map(|(k, e)| (&**k, e));
                Ok(())
            }
        }
    }
}

/// The deferred edits merged in key order, the newest edit of each key (sources
/// oldest first; a later source wins). A linear pass over the sources per key: a
/// transaction has tens of runs, not thousands.
pub(crate) struct Merge<'a> {
    sources: Vec<Source<'a>>,
    key: Vec<u8>,
}

impl Merge<'_> {
    /// The key and newest edit the merge stands at, `None` once done.
    pub(crate) fn current(&self) -> Option<(&[u8], EditRef<'_>)> {
        self.newest().and_then(|i| self.sources.get(i)?.current())
    }

    /// Moves past the current key, in every source that has it.
    pub(crate) fn advance(&mut self) -> Result<()> {
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        match self.current() {
            Some((k, _)) => key.extend_from_slice(k),
            None => return Ok(()),
        }
        let mut result = Ok(());
        for s in &mut self.sources {
            if matches!(s.current(), Some((k, _)) if k == key.as_slice()) {
                result = s.advance();
                if result.is_err() {
                    break;
                }
            }
        }
        self.key = key;
        result
    }

    /// The newest source at the smallest current key.
    fn newest(&self) -> Option<usize> {
        let mut best: Option<(usize, &[u8])> = None;
        for (i, s) in self.sources.iter().enumerate() {
            if let Some((k, _)) = s.current() {
                if best.is_none_or(|(_, b)| k <= b) {
                    best = Some((i, k));
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

/// A Bloom filter over 64-bit key hashes (two halves, double hashing).
struct Bloom {
    words: Vec<u64>,
    /// Bits - 1; the bit count is a power of two.
    mask: u64,
}

impl Bloom {
    fn for_keys(keys: usize) -> Bloom {
        let bits = (keys * BLOOM_BITS_PER_KEY).next_power_of_two().max(64);
        Bloom {
            words: vec![0; bits / 64],
            mask: bits as u64 - 1,
        }
    }

    /// The bits `hash` sets.
    fn probes(&self, hash: u64) -> impl Iterator<Item = u64> {
        let (a, b, mask) = (hash, (hash >> 32) | 1, self.mask);
        (0..BLOOM_PROBES).map(move |i| a.wrapping_add(i.wrapping_mul(b)) & mask)
    }

    fn insert(&mut self, hash: u64) {
        for bit in self.probes(hash) {
            if let Some(w) = self.words.get_mut((bit / 64) as usize) {
                *w |= 1 << (bit % 64);
            }
        }
    }

    fn may_contain(&self, hash: u64) -> bool {
        self.probes(hash).all(|bit| {
            self.words
                .get((bit / 64) as usize)
                .is_some_and(|w| w & (1 << (bit % 64)) != 0)
        })
    }
}

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
}

fn encode_entry(key: &[u8], edit: EditRef<'_>, out: &mut Vec<u8>) {
    let key_len = u16::try_from(key.len()).expect("keys are limited far below 64 KiB");
    put_u16(out, key_len);
    match edit {
        EditRef::Put(v) => {
            put_u8(out, TAG_PUT);
            out.extend_from_slice(key);
            put_u32(
                out,
                u32::try_from(v.len()).expect("inline values are small"),
            );
            out.extend_from_slice(v);
        }
        EditRef::Extent(r) => {
            put_u8(out, TAG_EXTENT);
            out.extend_from_slice(key);
            r.encode(out);
        }
        EditRef::Delete => {
            put_u8(out, TAG_DELETE);
            out.extend_from_slice(key);
        }
    }
}

fn decode_entry<'a>(d: &mut Decoder<'a>) -> Result<(&'a [u8], EditRef<'a>)> {
    let key_len = usize::from(d.u16()?);
    let tag = d.u8()?;
    let key = d.bytes(key_len)?;
    let edit = match tag {
        TAG_PUT => {
            let len = d.u32()? as usize;
            EditRef::Put(d.bytes(len)?)
        }
        TAG_EXTENT => EditRef::Extent(BlockRef::decode(d)?),
        TAG_DELETE => EditRef::Delete,
        other => return Err(d.error(format!("unknown edit tag {other}"))),
    };
    Ok((key, edit))
}

/// Whether `name` is a run file's name.
fn is_run_name(name: &str) -> bool {
    name.strip_prefix(RUN_PREFIX)
        .and_then(|r| r.strip_suffix(RUN_SUFFIX))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes the run files a crashed writer left in the store directory. Called by a
/// writable open before any transaction can make new ones.
pub(crate) fn remove_stale_runs(vfs: &dyn Vfs) -> Result<()> {
    for name in vfs.list()? {
        if is_run_name(&name) {
            match vfs.remove(&name) {
                // Gone since the listing: nothing left to remove.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "deferred_tests.rs"]
mod tests;
