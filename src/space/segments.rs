//! Segment files: append, read by reference, sync, delete.
//!
//! A segment file starts with a 32-byte header (magic, format version, segment id,
//! kind, checksum); blocks follow, packed, at any byte offset. Two streams of appends
//! each have an active segment, which takes appends until it passes
//! `SEGMENT_TARGET_BYTES`; then a new one is created (and the directory synced, so
//! the new file survives a crash before anything in it is relied on):
//! - **general** segments take what the engine writes for itself: tree nodes
//!   (checkpoints, spills), metadata blobs, back-reference runs, the cleaner's copies;
//! - **data** segments take value extents as transactions write them (a volume's
//!   blocks). Data is written once and read by reference; kept apart from the nodes,
//!   it is written sequentially, dies together (an overwritten volume empties whole
//!   data segments) and large appends go past the page cache
//!   ([`crate::io::VFile::write_direct_at`]): a long sequential write then costs the
//!   disk's bandwidth, not a copy into fresh cache pages.
//!
//! Which segments may still grow is the [`AppendFence`]: a checkpoint deletes an
//! emptied segment only if no append can land in it after its freeze.
//!
//! **Spare files.** An emptied segment whose file is at least half a segment long is
//! not removed but renamed `spare-<id>.dat` (at most twice the data checkpoint
//! threshold's worth of them, two at least, none on a disk short of space; past
//! that, removed), and the data stream's next segment is made from the oldest
//! spare: new header, synced, renamed, directory synced. Its appends then overwrite
//! blocks the file system has allocated and written, which this machine's disk
//! takes 1.5 times faster than new ones (fio, 2 MiB direct writes: 2.3 against 1.6
//! GB/s), whose `fdatasync` commits no journal transaction, and which direct writes
//! from several threads can share (ext4 serialises direct writes that extend a
//! file). Only a stream of whole-page appends takes a spare (a partial page over old
//! bytes would read them first). Spares are removed by `shrink` and `clean`, when a
//! process has written nothing for a checkpoint interval, and at a close, unless the
//! process keeps them for the next one (`Options::keep_spares_at_close`, which
//! `cambium serve` sets: at most half the limit, a threshold's worth, and no more
//! bytes than the segments hold); a writable open adopts any it finds (kept, or left
//! by a crash: nothing lives in a spare). PostgreSQL recycles its WAL segments for
//! the same reasons, across restarts too.
//!
//! Opening tells three kinds of file named like a segment apart by their header:
//! - a valid header: a segment of this store;
//! - no header yet, or part of one (every byte present is zero or the byte the
//!   header holds there, and nothing past it): `roll` was cut short by a crash. It
//!   syncs the header before anything is appended, so nothing durable lives in the
//!   file; it is kept as an empty segment (a checkpoint deletes it) but never
//!   continued, since its header is not there;
//! - anything else (another header, garbage, a header damaged since): a **stray**.
//!   A stray is ignored: never read, appended to or deleted, its id never reused;
//!   `verify` reports it, and a block the metadata places in it fails to read with
//!   a corruption error naming it.

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::format::{crc, Addr, BlockRef, Decoder, SegmentId};
use crate::io::{AlignedBuf, PendingSync, SyncHelper, VFile, Vfs, DIRECT_ALIGN};
use crate::sync::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

const SEGMENT_MAGIC: &[u8; 8] = b"CAMBSEG\0";

// Header layout: the byte offset of each field. docs/FORMAT.md has the same table, and
// `crate::format_tests` checks the two against each other.
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_FORMAT_VERSION: usize = 8;
pub(crate) const OFF_SEGMENT_ID: usize = 12;
pub(crate) const OFF_KIND: usize = 16;
pub(crate) const OFF_RESERVED: usize = 17;
/// The checksum covers every header byte before it.
pub(crate) const OFF_CRC: usize = 28;
/// Blocks start here.
pub(crate) const SEGMENT_HEADER_SIZE: u64 = 32;
const HEADER_LEN: usize = SEGMENT_HEADER_SIZE as usize;

// The fields are contiguous, each as wide as its type, and fill exactly the header.
const _: () = assert!(OFF_MAGIC == 0);
const _: () = assert!(OFF_MAGIC + SEGMENT_MAGIC.len() == OFF_FORMAT_VERSION);
const _: () = assert!(OFF_FORMAT_VERSION + size_of::<u32>() == OFF_SEGMENT_ID);
const _: () = assert!(OFF_SEGMENT_ID + size_of::<u32>() == OFF_KIND);
const _: () = assert!(OFF_KIND + size_of::<u8>() == OFF_RESERVED);
const _: () = assert!(OFF_RESERVED + 11 == OFF_CRC);
const _: () = assert!(OFF_CRC + size_of::<u32>() == HEADER_LEN);

/// docs/FORMAT.md's segment header table, checked against the constants above.
#[cfg(test)]
#[test]
fn header_layout_matches_format_md() {
    crate::format_tests::check_layout(
        "segment-header",
        &[
            ("magic", OFF_MAGIC),
            ("format_version", OFF_FORMAT_VERSION),
            ("segment_id", OFF_SEGMENT_ID),
            ("kind", OFF_KIND),
            ("reserved", OFF_RESERVED),
            ("crc", OFF_CRC),
        ],
        HEADER_LEN,
    );
}
/// A segment stops taking appends past this size. Big enough that a checkpoint is
/// one long sequential write, small enough that an emptied segment returns its space.
pub(crate) const SEGMENT_TARGET_BYTES: u64 = 64 << 20;

/// Appends of data look at the disk's free space once per this many bytes
/// ([`Segments::check_room`]): a `statvfs` per 4 KiB block would cost more than the
/// write. Far below the headroom kept, so that what passes unchecked fits in it.
const ROOM_CHECK_BYTES: u64 = 4 << 20;

/// Whether a data checkpoint threshold of `bytes`, fitted to the free space, means
/// the disk is short of it: under a quarter of the `configured` one (with the
/// default 1 GiB, under 1 GiB left). Only then are spare files given up and the
/// cleaner run after every checkpoint: a disk with a few GiB free loses neither.
fn is_short(bytes: u64, configured: u64) -> bool {
    bytes < configured / 4
}

/// The least data appended between checkpoints however little space is left
/// ([`Segments::fit_to_free_space`]): below it, checkpoints would come so often that
/// their own metadata took more room than they gave back.
const DATA_CHECKPOINT_MIN_BYTES: u64 = 16 << 20;

/// Layout buffers a data stream keeps for reuse (`Appender::scratch`): as many as
/// writes it usually has out at once (a few connections' batches), so that they do
/// not map and fault in a new one each time; a buffer is its own mapping, huge-page
/// backed when large.
const SCRATCH_KEPT: usize = 4;

/// An append of value extents at least this large goes past the page cache (when the
/// data segment's end is aligned for it, or can be made so). Smaller ones (a 4 KiB
/// block, a batch of a few) are buffered: a direct write waits for the device, a
/// buffered one only for a copy. Large ones are sequential streams (an image
/// import, a 1 MiB write) whose copy into fresh cache pages would cost more than the
/// write itself.
pub(crate) const DIRECT_MIN_BYTES: usize = 256 << 10;

/// How much of a prepared data segment one call of [`Segments::prepare_data_segment`]
/// fills with zeros.
const ZERO_CHUNK: usize = 1 << 20;

/// The most [`Segments::will_need`] asks the OS for in one request.
const WILL_NEED_CHUNK: u64 = 128 << 10;

/// The two kinds of segment, told apart by their header's kind byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nodes, metadata, back-reference runs and the cleaner's copies (every segment
    /// of a store written before data segments existed: the kind byte was zero).
    General = 0,
    /// Value extents written by transactions.
    Data = 1,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::General, Kind::Data];

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::General),
            1 => Some(Kind::Data),
            _ => None,
        }
    }
}

/// One stream of appends: its active segment and where the next block goes.
struct Appender {
    kind: Kind,
    active: Option<(SegmentId, Arc<dyn VFile>)>,
    end: u64,
    /// After open, before the first append: the segment of this kind the first append
    /// continues (the newest one, if whole and with room).
    resume: Option<SegmentId>,
    /// Buffers where several blocks are laid out back to back for one write (aligned
    /// for a direct write; see `io::pages`), kept between appends so that a stream of
    /// writes maps (and faults in) its buffer once: one for each write out at the
    /// same time, up to [`SCRATCH_KEPT`].
    scratch: Vec<AlignedBuf>,
    /// Whether the last append was small (buffered, not direct): a stream of small
    /// appends is what a segment filled with zeros ahead speeds up.
    small: bool,
    /// Whether the last append was of whole pages (every direct one is, padded; a
    /// volume's batch of 4 KiB blocks is): such a stream may continue in a spare
    /// file ([`Segments::take_spare`]) without reading the old pages it overwrites.
    page_whole: bool,
}

/// Zeros are written ahead of the data stream only while its appends are made durable
/// at least this often (in bytes appended between two syncs): each sync is then what
/// they save time on. A stream synced rarely (writes without flushes, whose cost is
/// the bandwidth) would only pay for writing them.
const ZEROS_SYNC_GAP: u64 = 1 << 20;

/// A group commit logs the unsynced value bytes its records depend on in the WAL,
/// in place of an fsync of their data segment, when they are this many bytes or
/// fewer and were written through the page cache ([`Segments::plan_values_sync`]):
/// one write and one fsync per group instead of two of each. A volume flushed every
/// 16 writes of 4 KiB syncs 64 KiB at a time.
pub(crate) const LOG_VALUES_MAX: usize = 256 << 10;

/// A segment file shorter than this is deleted, never kept as a spare: too little of
/// it would be overwritten to be worth a rename.
const SPARE_MIN_BYTES: u64 = SEGMENT_TARGET_BYTES / 2;

/// The name an emptied segment's file takes as a spare: unique, as ids are never
/// reused, and not a segment's name (so never opened as one).
fn spare_name(id: SegmentId) -> String {
    format!("spare-{:08x}.dat", id.0)
}

/// Whether `name` is a spare file's (see [`spare_name`]).
pub(crate) fn is_spare_name(name: &str) -> bool {
    name.strip_prefix("spare-")
        .and_then(|n| n.strip_suffix(".dat"))
        .is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The data segment made ahead of need ([`Segments::prepare_data_segment`]).
struct Prepared {
    id: SegmentId,
    file: Arc<dyn VFile>,
    /// The file is written up to here: its header, then zeros. An append below it
    /// overwrites blocks the file owns and has written, so the `fdatasync` that makes
    /// it durable has no metadata to commit (no journal transaction: on ext4 here
    /// ~0.1 ms instead of ~0.25 ms, measured with the WAL's own spare).
    zeroed: u64,
    /// Whether the file was synced since the last zeros were written.
    synced: bool,
}

/// Value extents placed in a data segment, their write not issued yet
/// ([`Segments::stage_values`]).
pub(crate) struct StagedValues<'v> {
    /// Where each extent is, in the order given.
    pub(crate) refs: Vec<BlockRef>,
    segment: SegmentId,
    file: Arc<dyn VFile>,
    at: u64,
    direct: bool,
    /// The references' checksums are the caller's to fill in
    /// ([`Segments::stage_values_for_overlap`]).
    checksums_deferred: bool,
    payload: Payload<'v>,
    /// Its bytes' share of the free space, until they are written.
    _room: RoomClaim,
}

/// Bytes an append of data counts on, from its room check until it is written
/// (dropped then): [`Segments::check_room`] leaves them to it.
struct RoomClaim {
    claimed: Arc<AtomicU64>,
    len: u64,
}

impl Drop for RoomClaim {
    fn drop(&mut self) {
        self.claimed.fetch_sub(self.len, Ordering::Relaxed);
    }
}

impl StagedValues<'_> {
    /// Whether the write goes past the page cache: a large one, worth overlapping
    /// with other work.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether `refs` still lack their checksums: the caller must fill them in with
    /// [`checksum_refs`] before anything uses them.
    pub(crate) fn checksums_deferred(&self) -> bool {
        self.checksums_deferred
    }
}

/// Fills in the checksums of `refs`, the references of `values` (in order) that
/// [`Segments::stage_values_for_overlap`] left without them.
pub(crate) fn checksum_refs(refs: &mut [BlockRef], values: &[&[u8]]) {
    debug_assert_eq!(refs.len(), values.len());
    for (r, v) in refs.iter_mut().zip(values) {
        r.crc = crc(v);
    }
}

/// The bytes of a staged write.
enum Payload<'v> {
    /// One value, or several lying back to back in the caller's memory (at an
    /// aligned address, when the write is direct), written from where they are.
    One(&'v [u8]),
    /// Several, laid out back to back (and aligned, for a direct write).
    Laid(AlignedBuf),
}

/// Whether `run` is exactly `values` back to back, in order (compared by address:
/// the same bytes, not equal ones).
fn is_laid_out(run: &[u8], values: &[&[u8]]) -> bool {
    let mut next = run.as_ptr() as usize;
    for v in values {
        if v.as_ptr() as usize != next {
            return false;
        }
        next += v.len();
    }
    next == run.as_ptr() as usize + run.len()
}

/// What is waiting for an fsync.
struct Unsynced {
    /// Segments written since their last sync.
    all: BTreeSet<SegmentId>,
    /// Segments holding value extents written since the WAL last synced them: a
    /// commit is acknowledged only once the extents its records name are durable.
    /// Kept apart from `all` so that a commit fsyncs only what its records depend
    /// on, not the nodes a background checkpoint is writing meanwhile. Only the
    /// WAL's (serialised) group-commit sync clears it.
    values: BTreeSet<SegmentId>,
    /// The writes behind `values`, while they are few and small enough to be logged
    /// ([`LOG_VALUES_MAX`]); `None` once they are not (a direct write, or too many
    /// bytes), until the next sync of `values`.
    ranges: Option<Vec<UnsyncedValues>>,
    /// Bytes of value writes since the last sync of `values` (in `ranges` while it
    /// is `Some`).
    range_bytes: usize,
}

impl Default for Unsynced {
    fn default() -> Unsynced {
        Unsynced {
            all: BTreeSet::new(),
            values: BTreeSet::new(),
            ranges: Some(Vec::new()),
            range_bytes: 0,
        }
    }
}

impl Unsynced {
    /// After every value write so far is taken to be made durable.
    fn values_taken(&mut self) -> BTreeSet<SegmentId> {
        self.ranges = Some(Vec::new());
        self.range_bytes = 0;
        std::mem::take(&mut self.values)
    }
}

/// One write of value extents to a data segment, not yet synced: `len` bytes at
/// `addr`, readable from `file` (an open file: still readable after its segment
/// is deleted).
pub(crate) struct UnsyncedValues {
    pub addr: Addr,
    pub len: usize,
    file: Arc<dyn VFile>,
}

impl UnsyncedValues {
    /// The offset in its segment just past it.
    fn end(&self) -> u64 {
        self.addr.offset() + self.len as u64
    }

    /// Its bytes, read back (from the page cache: they were written through it).
    pub(crate) fn read(&self) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.len];
        self.file.read_exact_at(&mut buf, self.addr.offset())?;
        Ok(buf)
    }
}

/// How a group commit makes the value extents its records name durable
/// ([`Segments::plan_values_sync`]).
pub(crate) enum ValuesPlan {
    /// Log these writes' bytes in the WAL, in the group's own write.
    Log(Vec<UnsyncedValues>),
    /// Fsync these segments ([`Segments::start_sync_of`]).
    Sync(BTreeSet<SegmentId>),
}

/// The segments appends may still reach, taken at a checkpoint's freeze: the two
/// active ones (or the ones each stream will continue) and every id not yet created.
/// Every other segment is closed for good, so one found empty can be deleted.
#[derive(Clone, Debug)]
pub(crate) struct AppendFence {
    growing: [Option<SegmentId>; 2],
    /// The data segment prepared ahead, not yet taken by the data stream.
    prepared: Option<SegmentId>,
    next: SegmentId,
    /// Segments holding values written ahead of the transaction that will name them
    /// ([`Segments::write_values_pinned`]): not empty, whatever the usage says.
    pinned: Vec<SegmentId>,
}

impl AppendFence {
    /// Whether an append made after the fence was taken may land in segment `id`, or
    /// one made before it may be named by a commit after it.
    pub(crate) fn may_grow(&self, id: SegmentId) -> bool {
        id >= self.next
            || self.growing.contains(&Some(id))
            || self.prepared == Some(id)
            || self.pinned.contains(&id)
    }
}

/// Values written ahead of the transaction that will name them: while it lives, a
/// fence counts their segment as one that may grow, so that no checkpoint deletes it
/// for looking empty before that transaction commits. Dropped after the commit (or
/// the abort, which leaves the values dead bytes).
pub(crate) struct Pin<'a> {
    segments: &'a Segments,
    id: SegmentId,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut pins = lock(&self.segments.pins);
        if let Some(n) = pins.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.id);
            }
        }
    }
}

// Ids are never reused: a new segment's id is past every file found at open, and the
// file with the highest id is never deleted ([`Segments::is_highest`]), so every id
// ever deleted is below it. (A reused id would meet stale records naming the old
// segment: a pending deletion, back references.)

pub(crate) struct Segments {
    vfs: Arc<dyn Vfs>,
    files: RwLock<BTreeMap<SegmentId, Arc<dyn VFile>>>,
    /// Files found with no header or part of one (see the module docs): never
    /// continued by appends.
    unwritten: BTreeSet<SegmentId>,
    /// Files named like segments that are not (see the module docs), with what is
    /// wrong with each. Not in `files`.
    strays: BTreeMap<SegmentId, String>,
    /// The general stream. Lock order: an appender, then `next_id`, then `unsynced`.
    general: Mutex<Appender>,
    /// The data stream.
    data: Mutex<Appender>,
    /// The id the next new segment takes (past every name found, strays included).
    next_id: Mutex<u32>,
    /// The id of the data segment being prepared or prepared ahead of need
    /// ([`Segments::prepare_data_segment`]), not yet taken by the data stream: a fence
    /// counts it as one appends may reach. Read and written under `next_id`'s lock.
    prepared_id: Mutex<Option<SegmentId>>,
    /// That segment once its header is durable, for the data stream's next roll.
    prepared: Mutex<Option<Prepared>>,
    /// A block of zeros, aligned for direct writes, made at the first use.
    zeros: std::sync::OnceLock<AlignedBuf>,
    /// Bytes appended to data segments since their last sync, and between the last
    /// two syncs that had any (see [`ZEROS_SYNC_GAP`]).
    since_sync: AtomicU64,
    sync_gap: AtomicU64,
    /// Whether zeros are written ahead at all (`Options::data_zeros_ahead`).
    zeros_ahead: AtomicBool,
    /// Whether small unsynced value extents may be logged in the WAL in place of a
    /// sync of their segments (`Options::log_small_values`).
    log_small_values: AtomicBool,
    unsynced: Mutex<Unsynced>,
    /// Held through [`Segments::sync`]: a caller that finds the set empty because
    /// another took it must not return before that one's fsyncs are done.
    syncing: Mutex<()>,
    /// The first failed fsync of a segment file, if any. After a failed fsync the
    /// kernel may have dropped the dirty pages it could not write and marked them
    /// clean, so a later fsync of the same file can succeed without them: every sync
    /// from then on fails (the store must be reopened, which recovers from what is
    /// durable), rather than report durable what may be lost.
    sync_failed: std::sync::OnceLock<String>,
    /// Segments with values written ahead of their transaction, and how many such
    /// writes are open ([`Pin`]); counted up under the data appender's lock, in the
    /// allocation's critical section, so that no fence misses one.
    pins: Mutex<BTreeMap<SegmentId, u32>>,
    /// Syncs value extents while the WAL syncs the records that name them.
    sync_helper: SyncHelper,
    /// A read-only open's copies of value extents that only the WAL holds (logged by
    /// a group commit whose process died before its segment was synced:
    /// [`Segments::restore`]), by address; read in place of the segment's bytes.
    restored: RwLock<BTreeMap<Addr, Vec<u8>>>,
    /// Emptied segment files kept to become data segments again (module docs,
    /// "Spare files"), oldest first, with their lengths; at most `spare_limit`.
    spares: Mutex<Vec<(String, u64)>>,
    spare_limit: AtomicU64,
    /// Bytes appended to data segments since the last checkpoint's fence: a
    /// checkpoint threshold ([`Segments::data_checkpoint_bytes`]).
    data_since_fence: AtomicU64,
    /// `Options::checkpoint_data_bytes`: the data threshold on a disk with room.
    data_checkpoint_configured: AtomicU64,
    /// The data threshold now: the configured one, or less on a disk short of space
    /// ([`Segments::fit_to_free_space`]).
    data_checkpoint_bytes: AtomicU64,
    /// Free bytes that appends of data never take ([`Segments::check_room`]).
    headroom: AtomicU64,
    /// Bytes of data appends that passed [`Segments::check_room`] and are not
    /// written yet ([`RoomClaim`]): the free space does not show them, and several
    /// large writes checked at once would each find the room the others take.
    claimed: Arc<AtomicU64>,
    /// The length at which a segment is full: [`SEGMENT_TARGET_BYTES`], or less on a
    /// disk short of space ([`Segments::fit_to_free_space`]).
    segment_target: AtomicU64,
    /// Data bytes staged since the disk's free space was last looked at.
    staged_since_room_check: AtomicU64,
    read_only: bool,
}

/// A sync of value extents in flight ([`Segments::start_sync_values`]).
pub(crate) struct ValuesSync<'s> {
    segments: &'s Segments,
    pending: PendingSync<'s>,
}

impl ValuesSync<'_> {
    /// Waits until the extents are durable. Fails if any segment fsync of this
    /// process has failed, this one or an earlier one (see `sync_failed`).
    pub(crate) fn finish(self) -> Result<()> {
        let ValuesSync { segments, pending } = self;
        if let Err(e) = pending.wait() {
            segments.note_sync_failure(&e);
        }
        segments.check_syncs()
    }
}

/// What a segment file's header says about the file (see the module docs).
enum Header {
    Valid(Kind),
    Unwritten,
    Stray(String),
}

impl Segments {
    /// Opens every segment file in the directory, checking each header; strays are
    /// set aside. Each stream's appends go to the end of the newest segment of its
    /// kind (never over anything already there: a crash may have left blocks a WAL
    /// record refers to). A name that is not a regular file (a directory, a dangling
    /// link) fails the open.
    pub(crate) fn open(vfs: Arc<dyn Vfs>, read_only: bool) -> Result<Segments> {
        let names = vfs.list()?;
        // Spare files a close kept, or a crash left: nothing lives in them, and the
        // data stream reuses them, oldest (lowest id) first. Fitted to the limit once
        // it is known (`fit_thresholds`). A reader leaves them to the writer.
        let mut spares = Vec::new();
        if !read_only {
            let mut names: Vec<&String> = names.iter().filter(|n| is_spare_name(n)).collect();
            names.sort();
            for name in names {
                match vfs.open(name).and_then(|f| f.len()) {
                    Ok(len) => spares.push((name.clone(), len)),
                    // Not a file this store can write over (a dangling link, say).
                    Err(_) => vfs.remove(name)?,
                }
            }
        }
        let mut ids: Vec<SegmentId> = names
            .iter()
            .filter_map(|n| SegmentId::parse_file_name(n))
            .collect();
        ids.sort();
        let mut files = BTreeMap::new();
        let mut unwritten = BTreeSet::new();
        let mut strays = BTreeMap::new();
        let mut newest_of = [None, None];
        for &id in &ids {
            let name = id.file_name();
            let file = match vfs.open(&name) {
                Ok(file) => file,
                // A reader beside a writer: a segment deleted since the listing (gone
                // from the directory, unlike a dangling link) is one that no checkpoint
                // from then on needs. If the state this reader goes on to load is
                // older and needed it, a checkpoint landed meanwhile and the open
                // starts over (`recovery::open_reader`).
                Err(e)
                    if read_only
                        && e.kind() == std::io::ErrorKind::NotFound
                        && !vfs.list()?.contains(&name) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            match Self::check_header(&*file, id)? {
                Header::Valid(kind) => {
                    newest_of[kind as usize] = Some(id);
                    if kind == Kind::General {
                        file.reads_are_random();
                    }
                }
                Header::Unwritten => {
                    unwritten.insert(id);
                }
                Header::Stray(why) => {
                    strays.insert(id, why);
                    continue;
                }
            }
            files.insert(id, file);
        }
        // Past every name, strays included: a new segment never takes a stray's id.
        let next_id = ids.last().map_or(1, |id| id.0 + 1);
        let appender = |kind: Kind| {
            Mutex::new(Appender {
                kind,
                active: None,
                end: 0,
                resume: newest_of[kind as usize],
                scratch: Vec::new(),
                small: false,
                page_whole: false,
            })
        };
        let sync_helper = SyncHelper::new(&*vfs);
        Ok(Segments {
            vfs,
            files: RwLock::new(files),
            unwritten,
            strays,
            general: appender(Kind::General),
            data: appender(Kind::Data),
            next_id: Mutex::new(next_id),
            prepared_id: Mutex::new(None),
            prepared: Mutex::new(None),
            zeros: std::sync::OnceLock::new(),
            since_sync: AtomicU64::new(0),
            sync_gap: AtomicU64::new(u64::MAX),
            zeros_ahead: AtomicBool::new(false),
            log_small_values: AtomicBool::new(true),
            unsynced: Mutex::new(Unsynced::default()),
            syncing: Mutex::new(()),
            sync_failed: std::sync::OnceLock::new(),
            pins: Mutex::new(BTreeMap::new()),
            sync_helper,
            restored: RwLock::new(BTreeMap::new()),
            spares: Mutex::new(spares),
            spare_limit: AtomicU64::new(0),
            data_since_fence: AtomicU64::new(0),
            data_checkpoint_configured: AtomicU64::new(u64::MAX),
            data_checkpoint_bytes: AtomicU64::new(u64::MAX),
            headroom: AtomicU64::new(0),
            claimed: Arc::default(),
            segment_target: AtomicU64::new(SEGMENT_TARGET_BYTES),
            // The first append looks.
            staged_since_room_check: AtomicU64::new(ROOM_CHECK_BYTES),
            read_only,
        })
    }

    /// Reads and classifies the header of segment `id`'s file.
    fn check_header(file: &dyn VFile, id: SegmentId) -> Result<Header> {
        let len = file.len()?;
        let present = usize::try_from(len).map_or(HEADER_LEN, |l| l.min(HEADER_LEN));
        let mut buf = [0u8; HEADER_LEN];
        #[allow(
            clippy::indexing_slicing,
            reason = "present is at most HEADER_LEN, the buffer's length"
        )]
        let read = &mut buf[..present];
        file.read_exact_at(read, 0)?;
        // Torn while being created: part of the header either kind would have.
        let torn = Kind::ALL.iter().any(|&kind| {
            let expected = Self::header(id, kind);
            let matches = read
                .iter()
                .zip(&expected)
                .all(|(byte, want)| *byte == 0 || byte == want);
            matches && read != expected
        });
        if len <= SEGMENT_HEADER_SIZE && torn {
            return Ok(Header::Unwritten);
        }
        if present < HEADER_LEN {
            return Ok(Header::Stray(format!(
                "it is {len} bytes, too short for a segment header"
            )));
        }
        let mut d = Decoder::new(&buf, "segment header");
        if d.bytes(8)? != SEGMENT_MAGIC {
            return Ok(Header::Stray("it has no segment header".into()));
        }
        let version = d.u32()?;
        let stored_id = d.u32()?;
        let kind_byte = d.u8()?;
        d.bytes(OFF_CRC - OFF_RESERVED)?;
        let stored_crc = d.u32()?;
        debug_assert_eq!(d.remaining(), 0);
        if crc(&buf[..OFF_CRC]) != stored_crc {
            return Ok(Header::Stray(
                "its segment header fails its checksum".into(),
            ));
        }
        // The superblock, read first, has this build's format version: a segment of
        // another version cannot be this store's.
        if version != FORMAT_VERSION {
            return Ok(Header::Stray(format!(
                "it is a segment of format version {version}, not {FORMAT_VERSION}"
            )));
        }
        if stored_id != id.0 {
            return Ok(Header::Stray(format!(
                "its header is that of {}",
                SegmentId(stored_id).file_name()
            )));
        }
        match Kind::from_byte(kind_byte) {
            Some(kind) => Ok(Header::Valid(kind)),
            None => Ok(Header::Stray(format!(
                "its header has an unknown segment kind {kind_byte}"
            ))),
        }
    }

    fn header(id: SegmentId, kind: Kind) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[OFF_MAGIC..OFF_FORMAT_VERSION].copy_from_slice(SEGMENT_MAGIC);
        h[OFF_FORMAT_VERSION..OFF_SEGMENT_ID].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[OFF_SEGMENT_ID..OFF_KIND].copy_from_slice(&id.0.to_le_bytes());
        h[OFF_KIND] = kind as u8;
        // The reserved bytes stay zero.
        let c = crc(&h[..OFF_CRC]);
        h[OFF_CRC..].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Starts a new segment file for `app`'s stream. Its creation is made durable at
    /// once.
    fn roll(&self, app: &mut Appender) -> Result<()> {
        // The data segment prepared ahead, unless it is being prepared right now.
        let prepared = match app.kind {
            Kind::Data => self.prepared.try_lock().ok().and_then(|mut p| p.take()),
            Kind::General => None,
        };
        let (id, file, zeroed) = match prepared {
            Some(ready) => {
                // The stream holds it from here: a fence sees it as active.
                let _next = lock(&self.next_id);
                let mut prepared_id = lock(&self.prepared_id);
                if *prepared_id == Some(ready.id) {
                    *prepared_id = None;
                }
                (ready.id, ready.file, ready.zeroed > SEGMENT_HEADER_SIZE)
            }
            None => {
                let id = self.take_id(None);
                let reuse = app.kind == Kind::Data && app.page_whole;
                let (file, written) = self.new_segment(id, app.kind, reuse)?;
                (id, file, written > SEGMENT_HEADER_SIZE)
            }
        };
        Self::cut_tail(app);
        self.files
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, file.clone());
        app.active = Some((id, file));
        app.resume = None;
        // Over zeros written ahead, blocks start on a page: blocks of whole pages (a
        // volume's 4 KiB blocks) then replace whole pages of zeros, without reading
        // them first. (Elsewhere they follow the header: a gap would be dead bytes.)
        app.end = match zeroed {
            true => DIRECT_ALIGN as u64,
            false => SEGMENT_HEADER_SIZE,
        };
        Ok(())
    }

    /// The next segment id; with `prepared`, it is also recorded as the prepared data
    /// segment's, in the same critical section (so no fence misses it).
    fn take_id(&self, prepared: Option<&Mutex<Option<SegmentId>>>) -> SegmentId {
        let mut next = lock(&self.next_id);
        let id = SegmentId(*next);
        *next += 1;
        if let Some(p) = prepared {
            *lock(p) = Some(id);
        }
        id
    }

    /// Creates segment `id` of `kind` with its header, durable, named in a durable
    /// directory. A file created but not finished is removed (nothing is in it): on
    /// a full disk each failed roll would otherwise leave an empty file behind.
    fn create_segment(&self, id: SegmentId, kind: Kind) -> Result<Arc<dyn VFile>> {
        let name = id.file_name();
        let file = self.vfs.create(&name)?;
        let finished = (|| {
            if kind == Kind::General {
                file.reads_are_random();
            }
            file.write_all_at(&Self::header(id, kind), 0)?;
            file.sync().inspect_err(|e| self.note_sync_failure(e))?;
            self.vfs.sync_dir()
        })();
        match finished {
            Ok(()) => Ok(file),
            Err(e) => {
                drop(file);
                let _ = self.vfs.remove(&name);
                Err(e.into())
            }
        }
    }

    /// A new segment `id` of `kind`, durable and named in a durable directory, and how
    /// far its file is written (its header, or more). With `reuse`, a spare file
    /// becomes it if there is one (its old bytes then lie past every block, dead);
    /// otherwise, or if that fails, a new file is created.
    fn new_segment(&self, id: SegmentId, kind: Kind, reuse: bool) -> Result<(Arc<dyn VFile>, u64)> {
        if reuse {
            if let Some(reused) = self.take_spare(id, kind) {
                return Ok(reused);
            }
        }
        match self.create_segment(id, kind) {
            // The spares' space is the store's to use: given back, and one more try.
            Err(e) if e.is_storage_full() && self.spare_count() > 0 => {
                self.discard_spares()?;
                Ok((self.create_segment(id, kind)?, SEGMENT_HEADER_SIZE))
            }
            other => Ok((other?, SEGMENT_HEADER_SIZE)),
        }
    }

    /// Makes the oldest spare file segment `id` of `kind` (module docs, "Spare
    /// files"): its new header is written and synced while it still has its spare
    /// name, then it is renamed and the directory synced. A crash before the rename
    /// leaves a spare (adopted again by the next open); after it, an empty segment whose
    /// bytes past the header are dead (appends never continue a file past its end).
    /// `None` if there is no spare, or if this one fails (it is then removed, under
    /// either name, so that the caller can create segment `id` instead).
    fn take_spare(&self, id: SegmentId, kind: Kind) -> Option<(Arc<dyn VFile>, u64)> {
        let (spare, len) = {
            let mut spares = lock(&self.spares);
            if spares.is_empty() {
                return None;
            }
            spares.remove(0)
        };
        if self.vfs.readers_present() {
            // A reader in another process may still read the segment this spare was
            // through its open descriptor: unlinked, its bytes stay for the reader,
            // and the space comes back when the reader closes.
            let _ = self.vfs.remove(&spare);
            return None;
        }
        let name = id.file_name();
        let reused = (|| -> std::io::Result<Arc<dyn VFile>> {
            let file = self.vfs.open(&spare)?;
            file.write_all_at(&Self::header(id, kind), 0)?;
            file.sync().inspect_err(|e| self.note_sync_failure(e))?;
            drop(file);
            self.vfs.rename(&spare, &name)?;
            self.vfs.sync_dir()?;
            // Opened again under its new name: a file finds its path by name (its
            // direct-write descriptor is opened by path, at the first direct write).
            self.vfs.open(&name)
        })();
        match reused {
            Ok(file) => Some((file, len)),
            Err(_) => {
                // Its space back, and a new file instead, under the same name if the
                // rename happened (nothing is in it yet).
                let _ = self.vfs.remove(&spare);
                let _ = self.vfs.remove(&name);
                None
            }
        }
    }

    /// The most spare files kept now (module docs, "Spare files").
    pub(crate) fn spare_limit(&self) -> u64 {
        self.spare_limit.load(Ordering::Relaxed)
    }

    /// Keeps at most `files` spare files from now on (module docs, "Spare files").
    #[cfg(test)]
    pub(crate) fn set_spare_limit(&self, files: u64) {
        self.spare_limit.store(files, Ordering::Relaxed);
    }

    /// Sets the data checkpoint threshold (`Options::checkpoint_data_bytes`) and fits
    /// it, and the spare files kept, to the free space ([`Segments::fit_to_free_space`]).
    pub(crate) fn set_data_checkpoint_bytes(&self, bytes: u64) {
        self.data_checkpoint_configured
            .store(bytes, Ordering::Relaxed);
        self.fit_to_free_space();
    }

    /// The bytes the store can still write, if known: the disk's free space and the
    /// spare files (reused before anything else).
    pub(crate) fn room(&self) -> Option<u64> {
        let free = self.vfs.free_bytes()?;
        Some(free.saturating_add(self.spare_bytes()))
    }

    /// Whether the disk has at least half the headroom free (the reserve's size):
    /// room for a checkpoint's metadata without the reserve (`checkpoint::has_room`).
    pub(crate) fn room_for_metadata(&self) -> bool {
        let half = self.headroom.load(Ordering::Relaxed) / 2;
        self.room().is_none_or(|room| room >= half)
    }

    /// Whether the disk is short of space: the data checkpoint threshold had to be
    /// lowered to under a quarter of the configured one ([`is_short`]).
    pub(crate) fn short_of_space(&self) -> bool {
        is_short(
            self.data_checkpoint_bytes(),
            self.data_checkpoint_configured.load(Ordering::Relaxed),
        )
    }

    /// Refuses an append of `len` bytes of data that would leave the disk with less
    /// than the headroom free ([`Segments::fit_to_free_space`]), with `StorageFull`,
    /// before anything is staged. The headroom is for the work that gives space
    /// back: the checkpoints that delete the segments overwritten data emptied (and
    /// the reserve file they may spend, restored after them), and the cleaner's
    /// moves. Without it the data a client writes as fast as it can takes every
    /// byte a checkpoint frees, the next checkpoint finds the disk full, and the
    /// store is stuck: nothing can be freed without writing first. ZFS keeps its
    /// "slop space" from data writes for the same reason. Looks at the disk once per
    /// [`ROOM_CHECK_BYTES`] (and at every append while it is short). The appends
    /// checked but not yet written count as taken (16 clients writing 32 MiB each at
    /// once all passed on a disk with 339 MB free, and filled it).
    fn check_room(&self, len: u64) -> Result<RoomClaim> {
        let others = self.claimed.fetch_add(len, Ordering::Relaxed);
        let claim = RoomClaim {
            claimed: self.claimed.clone(),
            len,
        };
        let staged = self
            .staged_since_room_check
            .fetch_add(len, Ordering::Relaxed)
            + len;
        if staged < ROOM_CHECK_BYTES {
            return Ok(claim);
        }
        let Some(room) = self.room() else {
            self.staged_since_room_check.store(0, Ordering::Relaxed);
            return Ok(claim);
        };
        self.fit_thresholds(Some(room));
        let headroom = self.headroom.load(Ordering::Relaxed);
        let room = room.saturating_sub(others);
        if room < headroom.saturating_add(len) {
            #[expect(clippy::cast_precision_loss, reason = "a size in a message")]
            let mib = |n: u64| n as f64 / f64::from(1 << 20);
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "the disk is nearly full: {:.1} MiB free, and the store keeps \
                     {:.1} MiB of it for the checkpoints and cleaning that give space \
                     back (drop a version or volume, or free space on the disk)",
                    mib(room),
                    mib(headroom)
                ),
            )));
        }
        self.staged_since_room_check.store(0, Ordering::Relaxed);
        Ok(claim)
    }

    /// Bytes of data appended after which a checkpoint is due.
    pub(crate) fn data_checkpoint_bytes(&self) -> u64 {
        self.data_checkpoint_bytes.load(Ordering::Relaxed)
    }

    /// Fits the data checkpoint threshold to the space left on the disk, and the
    /// spare files kept to the threshold (module docs, "Spare files"; none when the
    /// disk is short of space). Called at the open and after each checkpoint.
    ///
    /// Space that data overwrote comes back only through checkpoints: the one after
    /// the overwrite finds its segment empty, the one after that deletes it. So a
    /// store that overwrites `T` bytes between checkpoints holds up to about `2T` of
    /// dead data on top of its live data. With the configured 1 GiB, a volume
    /// overwritten on a disk with less than ~2 GiB free would fill it with dead
    /// segments before the first checkpoint came. The threshold is therefore at most
    /// a quarter of the free space (spare files count as free: they are reused
    /// first), and never below [`DATA_CHECKPOINT_MIN_BYTES`].
    ///
    /// It also sets the headroom that appends of data leave free
    /// ([`Segments::check_room`]): twice the reserve the store's size calls for.
    pub(crate) fn fit_to_free_space(&self) {
        let segment_bytes = self.sizes().map_or(0, |s| s.iter().map(|(_, n)| n).sum());
        self.headroom
            .store(2 * crate::io::reserve_for(segment_bytes), Ordering::Relaxed);
        self.fit_thresholds(self.room());
        // Spares an open adopted may be more than the limit allows now (a disk that
        // filled since, a smaller threshold). Best effort: one left over is reused
        // or removed later.
        let limit = self.spare_limit.load(Ordering::Relaxed);
        let _ = self.trim_spares(limit, u64::MAX);
    }

    /// [`Segments::fit_to_free_space`] but the headroom, for `room` bytes left (also
    /// called by each look at the disk, [`Segments::check_room`]: the disk may fill
    /// from elsewhere between checkpoints).
    fn fit_thresholds(&self, room: Option<u64>) {
        let configured = self.data_checkpoint_configured.load(Ordering::Relaxed);
        let bytes = match room {
            Some(room) => (room / 4).max(DATA_CHECKPOINT_MIN_BYTES).min(configured),
            None => configured,
        };
        self.data_checkpoint_bytes.store(bytes, Ordering::Relaxed);
        // Short of space, the space of emptied segments goes back to the disk: a
        // spare would hold it for appends that may come only after the disk filled.
        let short = is_short(bytes, configured);
        // Twice the segments a threshold's worth of data fills: each data
        // checkpoint turns the segments emptied before the last one into spares at
        // once, while the stream goes on taking them; with room for one threshold's
        // worth, what came while the pool was still full was deleted and the stream
        // ran dry before the next checkpoint, writing new files (1 MiB writes after
        // random ones: medians of seven alternated runs 2,142 against 2,354 MB/s).
        // The files of a long overwrite stay about the same: spares in place of
        // segments deleted and made again.
        let spares = match short {
            true => 0,
            false => (2 * bytes / SEGMENT_TARGET_BYTES).max(2),
        };
        self.spare_limit.store(spares, Ordering::Relaxed);
        // Short of space, segments are smaller too: a segment comes back only once
        // all of it is dead (or the cleaner moved the rest out, which takes room), and
        // 64 MiB segments on a disk with 100 MiB left would hold most of it.
        let target = match short {
            true => (bytes / 2).clamp(SEGMENT_HEADER_SIZE + (4 << 20), SEGMENT_TARGET_BYTES),
            false => SEGMENT_TARGET_BYTES,
        };
        self.segment_target.store(target, Ordering::Relaxed);
    }

    /// Removes every spare file, durably (a close, a shrink: the store's footprint is
    /// then its segments), and returns the bytes they held. Tries them all; the first
    /// error, if any (a spare left is removed by a later close, or reused).
    pub(crate) fn discard_spares(&self) -> Result<u64> {
        self.trim_spares(0, 0)
    }

    /// Removes spare files, newest first, until at most `files` of them holding at
    /// most `bytes` are left (a close that keeps them for the next process:
    /// `Options::keep_spares_at_close`), durably if any went; returns the bytes
    /// removed. Tries them all; the first error, if any.
    pub(crate) fn trim_spares(&self, files: u64, bytes: u64) -> Result<u64> {
        let gone = {
            let mut spares = lock(&self.spares);
            let mut kept = 0u64;
            let keep = spares
                .iter()
                .take_while(|(_, len)| {
                    kept = kept.saturating_add(*len);
                    kept <= bytes
                })
                .count()
                .min(usize::try_from(files).unwrap_or(usize::MAX));
            spares.split_off(keep)
        };
        if gone.is_empty() {
            return Ok(0);
        }
        let removed: std::io::Result<()> = gone
            .iter()
            .map(|(name, _)| self.vfs.remove(name))
            .fold(Ok(()), Result::and);
        removed?;
        self.vfs.sync_dir()?;
        Ok(gone.iter().map(|(_, len)| len).sum())
    }

    /// The number of spare files held now.
    pub(crate) fn spare_count(&self) -> usize {
        lock(&self.spares).len()
    }

    /// The bytes of the spare files held now.
    pub(crate) fn spare_bytes(&self) -> u64 {
        lock(&self.spares).iter().map(|(_, len)| len).sum()
    }

    /// Bytes appended to data segments since the last [`Segments::fence`].
    pub(crate) fn data_since_fence(&self) -> u64 {
        self.data_since_fence.load(Ordering::Relaxed)
    }

    /// Prepares the data stream's next segment ahead of need, one step per call, once
    /// the active one is three quarters full. Called by a committer after it let go
    /// of the writer lock; a no-op while another call is at it.
    ///
    /// The first step creates the file (from a spare if the stream's appends are of
    /// whole pages: module docs, "Spare files"), so that the append that fills the
    /// active segment does not create one and wait for two fsyncs (~0.4 ms here, more
    /// in the disk's tail) while its transaction holds the writer lock, as every other
    /// writer, a snapshot or a clone then would. A spare needs no zeros. If zeros ahead are on
    /// (`Options::data_zeros_ahead`, off by default: they double the bytes written)
    /// and the appends are small (4 KiB blocks, flushed every few), each later step
    /// writes the next
    /// [`ZERO_CHUNK`] of zeros past the page cache, and the last one syncs the file:
    /// the small appends that land there overwrite written blocks, and each flush's
    /// `fdatasync` of the data then has no metadata to commit (the WAL's spare file
    /// is made so for the same reason). Large appends (a 1 MiB write, an import)
    /// stream at the disk's bandwidth and gain nothing from it, so the zeros wait.
    /// A crash leaves the segment empty, never appended to (its zeros read as a torn
    /// tail's would: past every block), deleted by a later checkpoint.
    pub(crate) fn prepare_data_segment(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let target = self.segment_target();
        let due = target / 4 * 3;
        // (Not on a disk short of space, whose segments are smaller: the zeros would
        // take space ahead of need.)
        let synced_often = self.zeros_ahead.load(Ordering::Relaxed)
            && self.sync_gap.load(Ordering::Relaxed) <= ZEROS_SYNC_GAP
            && target == SEGMENT_TARGET_BYTES;
        let (small, page_whole, zeros_due) = {
            let app = self.appender(Kind::Data);
            if app.active.is_none() || app.end < due {
                return Ok(());
            }
            // The zeros keep pace with the active segment's last quarter (eight bytes
            // for each byte appended, two chunks ahead: done, and synced, with an
            // eighth of the segment to go), a chunk every so many commits rather than
            // all of them in the first commits' way.
            let pace = (app.end - due) * 8 + 2 * ZERO_CHUNK as u64;
            (app.small, app.page_whole, pace.min(target))
        };
        let Ok(mut slot) = self.prepared.try_lock() else {
            return Ok(()); // another committer is preparing it
        };
        match &mut *slot {
            None => {
                let id = self.take_id(Some(&self.prepared_id));
                match self.new_segment(id, Kind::Data, page_whole) {
                    Ok((file, written)) => {
                        *slot = Some(Prepared {
                            id,
                            file,
                            zeroed: written,
                            synced: true,
                        });
                        Ok(())
                    }
                    Err(e) => {
                        // The id stays burned (ids are never reused); the next roll
                        // creates its own segment.
                        *lock(&self.prepared_id) = None;
                        Err(e)
                    }
                }
            }
            Some(p) if small && synced_often && p.zeroed < zeros_due => {
                let zeros = self.zeros.get_or_init(|| {
                    let mut z = AlignedBuf::default();
                    z.reserve(ZERO_CHUNK);
                    z.extend_from_slice(&vec![0; ZERO_CHUNK]);
                    z
                });
                let to = (p.zeroed / ZERO_CHUNK as u64 + 1) * ZERO_CHUNK as u64;
                let to = to.min(target);
                // Up to the first aligned offset through the page cache (the header's
                // page), the rest past it.
                let aligned = p.zeroed.next_multiple_of(DIRECT_ALIGN as u64).min(to);
                let len = |a: u64, b: u64| usize::try_from(b - a).expect("under a chunk");
                if aligned > p.zeroed {
                    p.file
                        .write_all_at(&zeros.as_slice()[..len(p.zeroed, aligned)], p.zeroed)?;
                }
                if to > aligned {
                    p.file
                        .write_direct_at(&zeros.as_slice()[..len(aligned, to)], aligned)?;
                }
                p.zeroed = to;
                p.synced = false;
                Ok(())
            }
            Some(p) if !p.synced && p.zeroed >= target => {
                p.file.sync().inspect_err(|e| self.note_sync_failure(e))?;
                p.synced = true;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// The length at which a segment is full (see the field).
    fn segment_target(&self) -> u64 {
        self.segment_target.load(Ordering::Relaxed)
    }

    /// Makes sure `app` has an active segment with room for `len` more bytes.
    fn ensure_active(&self, app: &mut Appender, len: u64) -> Result<()> {
        let target = self.segment_target();
        if app.active.is_none() {
            // After open: continue the newest segment of this stream's kind if it has
            // its whole header and room (never over anything already there: a crash
            // may have left blocks a WAL record refers to).
            if let Some(id) = app.resume.take() {
                if let Some(file) = self.file(id).filter(|_| !self.unwritten.contains(&id)) {
                    let end = file.len()?.max(SEGMENT_HEADER_SIZE);
                    if end + len <= target {
                        app.active = Some((id, file));
                        app.end = end;
                        return Ok(());
                    }
                }
            }
            return self.roll(app);
        }
        if app.end > SEGMENT_HEADER_SIZE && app.end + len > target {
            return self.roll(app);
        }
        Ok(())
    }

    /// Keeps the streams from continuing any of `ids` after the open (segments the
    /// store's metadata says are waiting to be deleted: emptied, and closed to
    /// appends, when a checkpoint found them so). Called before the first append.
    pub(crate) fn do_not_resume(&self, ids: impl Iterator<Item = SegmentId>) {
        let ids: BTreeSet<SegmentId> = ids.collect();
        for kind in Kind::ALL {
            let mut app = self.appender(kind);
            if app.resume.is_some_and(|id| ids.contains(&id)) {
                app.resume = None;
            }
        }
    }

    fn appender(&self, kind: Kind) -> MutexGuard<'_, Appender> {
        lock(match kind {
            Kind::General => &self.general,
            Kind::Data => &self.data,
        })
    }

    /// Appends `data` as one block to a general segment and returns its reference.
    /// Not durable until [`Segments::sync`].
    pub(crate) fn append(&self, data: &[u8]) -> Result<BlockRef> {
        let (addr, _) = self.append_many(data)?;
        Ok(BlockRef {
            addr,
            len: crate::format::len_u32(data.len()),
            crc: crc(data),
        })
    }

    /// Appends a value extent that a WAL record will name to a data segment, like
    /// [`Segments::append_values`] with one value.
    pub(crate) fn append_value(&self, data: &[u8]) -> Result<BlockRef> {
        let mut refs = self.append_values(&[data])?;
        Ok(refs.pop().expect("one reference per value"))
    }

    /// Appends value extents that WAL records will name to a data segment, back to
    /// back in one write, and returns their references in order: what
    /// [`Segments::stage_values`] and [`Segments::write_staged`] do together.
    pub(crate) fn append_values(&self, values: &[&[u8]]) -> Result<Vec<BlockRef>> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let mut staged = self.stage_values(values, None)?;
        let refs = std::mem::take(&mut staged.refs);
        self.write_staged(staged)?;
        Ok(refs)
    }

    /// Places value extents in a data segment, back to back, and lays them out for
    /// one write, which [`Segments::write_staged`] issues (from another thread if the
    /// caller has other work meanwhile: a large transaction updates its tree while
    /// the extents go to disk). The references are valid once that write returns;
    /// the extents are durable after [`Segments::sync_values`] (or
    /// [`Segments::sync`]) that follows it. `DIRECT_MIN_BYTES` or more in all, they
    /// are written past the page cache, from a 4 KiB-aligned offset (the bytes
    /// skipped to reach it, and the tail padding that makes the write's length
    /// aligned, are dead space in the segment).
    /// `values` is not empty (staging nothing would still open a data segment).
    ///
    /// `run`, if given, may be the values back to back in the caller's memory (a
    /// volume write's payload, its blocks in order): if it is, and its address and
    /// length are aligned for a direct write, the write goes out from there instead of
    /// being copied into the stream's buffer first. Anything else is ignored.
    pub(crate) fn stage_values<'v>(
        &self,
        values: &[&'v [u8]],
        run: Option<&'v [u8]>,
    ) -> Result<StagedValues<'v>> {
        self.stage_values_pinning(values, run, false, false)
    }

    /// [`Segments::stage_values`] for a caller that overlaps the write with other
    /// work: when the write is direct ([`StagedValues::checksums_deferred`]), the
    /// references' checksums are left for the caller to fill in
    /// ([`checksum_refs`]) while the write is in flight, instead of being computed
    /// before it can start (8 MiB of checksums is about a millisecond).
    pub(crate) fn stage_values_for_overlap<'v>(
        &self,
        values: &[&'v [u8]],
        run: Option<&'v [u8]>,
    ) -> Result<StagedValues<'v>> {
        self.stage_values_pinning(values, run, false, true)
    }

    /// [`Segments::stage_values`], also pinning the segment (see [`Pin`]) if `pin`,
    /// and leaving a direct write's checksums to the caller if `defer_checksums`.
    fn stage_values_pinning<'v>(
        &self,
        values: &[&'v [u8]],
        run: Option<&'v [u8]>,
        pin: bool,
        defer_checksums: bool,
    ) -> Result<StagedValues<'v>> {
        assert!(!self.read_only, "append on a read-only store");
        assert!(!values.is_empty(), "staging no values");
        let total: usize = values.iter().map(|v| v.len()).sum();
        let room = self.check_room(total as u64)?;
        let direct = total >= DIRECT_MIN_BYTES;
        let in_place = run.filter(|run| {
            direct
                && is_laid_out(run, values)
                && (run.as_ptr() as usize | run.len()).is_multiple_of(DIRECT_ALIGN)
        });
        let mut guard = self.appender(Kind::Data);
        let app = &mut *guard;
        let padded = if direct {
            total.next_multiple_of(DIRECT_ALIGN)
        } else {
            total
        };
        // Room for the worst-case alignment gap too, so the roll check sees it.
        let gap_room = if direct { DIRECT_ALIGN } else { 0 };
        self.ensure_active(app, (padded + gap_room) as u64)?;
        let (id, file) = app.active.clone().expect("ensured");
        app.small = !direct;
        app.page_whole = padded.is_multiple_of(DIRECT_ALIGN);
        self.since_sync.fetch_add(padded as u64, Ordering::Relaxed);
        self.data_since_fence
            .fetch_add(padded as u64, Ordering::Relaxed);
        if pin {
            *lock(&self.pins).entry(id).or_insert(0) += 1;
        }
        let at = if direct {
            app.end.next_multiple_of(DIRECT_ALIGN as u64)
        } else {
            app.end
        };
        app.end = at + padded as u64;
        let payload = match (values, in_place) {
            (_, Some(run)) => Payload::One(run),
            ([one], None) if !direct => Payload::One(one),
            _ => {
                // A kept buffer, lent to this write; a new one when every kept one
                // is out with another write.
                let mut buf = app.scratch.pop().unwrap_or_default();
                buf.clear();
                buf.reserve(padded);
                for v in values {
                    buf.extend_from_slice(v);
                }
                if direct {
                    buf.pad_to_alignment();
                }
                Payload::Laid(buf)
            }
        };
        drop(guard);
        // Checksums outside the appender's lock.
        let checksums_deferred = direct && defer_checksums;
        let mut offset = at;
        let refs = values
            .iter()
            .map(|v| {
                let r = BlockRef {
                    addr: Addr::new(id, offset),
                    len: crate::format::len_u32(v.len()),
                    crc: if checksums_deferred { 0 } else { crc(v) },
                };
                offset += v.len() as u64;
                r
            })
            .collect();
        Ok(StagedValues {
            refs,
            segment: id,
            file,
            at,
            direct,
            checksums_deferred,
            payload,
            _room: room,
        })
    }

    /// Writes `values` to a data segment before the transaction that will name them
    /// has begun, so that the write is not made under the writer lock, where every
    /// other writer, a snapshot or a clone would wait for it (a volume's write batch:
    /// the copy into the page cache was a third of a connection thread's time; an
    /// 8 MiB direct write takes milliseconds). The [`Pin`] keeps their segment from
    /// being deleted until that transaction is over. `run` is as for
    /// [`Segments::stage_values`]; a direct write's checksums are computed while it
    /// is in flight.
    pub(crate) fn write_values_pinned(
        &self,
        values: &[&[u8]],
        run: Option<&[u8]>,
    ) -> Result<(Vec<BlockRef>, Pin<'_>)> {
        let mut staged = self.stage_values_pinning(values, run, true, true)?;
        let pin = Pin {
            segments: self,
            id: staged.segment,
        };
        let mut refs = std::mem::take(&mut staged.refs);
        if !staged.checksums_deferred {
            self.write_staged(staged)?;
            return Ok((refs, pin));
        }
        // The write starts at once, on this thread; the checksums, which are needed
        // only once it is done, on a helper (a thread just spawned can wait ~0.2 ms
        // for a CPU on a busy 2-vCPU machine: a write that waited for it started that
        // much later, a fifth of a 2.5 MB landing's time).
        let written = std::thread::scope(|scope| {
            let sums = std::thread::Builder::new()
                .spawn_scoped(scope, || values.iter().map(|v| crc(v)).collect::<Vec<_>>());
            let written = self.write_staged(staged);
            match sums {
                Ok(sums) => {
                    let sums = sums
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    for (r, sum) in refs.iter_mut().zip(sums) {
                        r.crc = sum;
                    }
                }
                // No thread to be had: the checksums after the write.
                Err(_) => checksum_refs(&mut refs, values),
            }
            written
        });
        written?;
        Ok((refs, pin))
    }

    /// Issues the write [`Segments::stage_values`] laid out. On an error the extents
    /// are dead space: the transaction that staged them must not commit them.
    pub(crate) fn write_staged(&self, staged: StagedValues<'_>) -> Result<()> {
        let StagedValues {
            segment,
            file,
            at,
            direct,
            payload,
            ..
        } = staged;
        let len = match payload {
            Payload::One(bytes) if direct => {
                file.write_direct_at(bytes, at)?;
                bytes.len()
            }
            Payload::One(bytes) => {
                file.write_all_at(bytes, at)?;
                bytes.len()
            }
            Payload::Laid(buf) => {
                if direct {
                    file.write_direct_at(buf.as_slice(), at)?;
                } else {
                    file.write_all_at(buf.as_slice(), at)?;
                }
                let len = buf.as_slice().len();
                let kept = &mut self.appender(Kind::Data).scratch;
                if kept.len() < SCRATCH_KEPT {
                    kept.push(buf);
                }
                len
            }
        };
        // After the write: a sync that takes the set before this insert did not
        // cover these extents, and the next one will.
        let mut unsynced = lock(&self.unsynced);
        unsynced.all.insert(segment);
        unsynced.values.insert(segment);
        let loggable = !direct
            && unsynced.range_bytes + len <= LOG_VALUES_MAX
            && self.log_small_values.load(Ordering::Relaxed);
        match &mut unsynced.ranges {
            // Back to back with the last write (the stream's usual case): one range,
            // read back in one go.
            Some(ranges) if loggable => match ranges.last_mut() {
                Some(last) if last.addr.segment() == segment && last.end() == at => {
                    last.len += len;
                }
                _ => ranges.push(UnsyncedValues {
                    addr: Addr::new(segment, at),
                    len,
                    file,
                }),
            },
            _ => unsynced.ranges = None,
        }
        unsynced.range_bytes += len;
        Ok(())
    }

    /// Appends a buffer holding several blocks to a general segment; returns the
    /// address of its first byte (blocks inside are at that address plus their
    /// offset in the buffer) and the segment it went to.
    pub(crate) fn append_many(&self, data: &[u8]) -> Result<(Addr, SegmentId)> {
        assert!(!self.read_only, "append on a read-only store");
        let mut app = self.appender(Kind::General);
        let len = data.len() as u64;
        self.ensure_active(&mut app, len)?;
        let (id, file) = app.active.clone().expect("ensured");
        let at = app.end;
        file.write_all_at(data, at)?;
        app.end += len;
        lock(&self.unsynced).all.insert(id);
        Ok((Addr::new(id, at), id))
    }

    /// Reads a block and checks its checksum.
    pub(crate) fn read(&self, r: BlockRef, what: &'static str) -> Result<Vec<u8>> {
        let read = self.read_span(r.addr, r.len, what).and_then(|buf| {
            if crc(&buf) != r.crc {
                return Err(Error::corrupted(
                    what,
                    format!("checksum mismatch at {:?} ({} bytes)", r.addr, r.len),
                ));
            }
            Ok(buf)
        });
        match read {
            Err(e) if e.is_corruption() => self.restored_copy(r).ok_or(e),
            read => read,
        }
    }

    /// A copy of extent `r` that [`Segments::restore`] kept, if it has one.
    fn restored_copy(&self, r: BlockRef) -> Option<Vec<u8>> {
        let restored = self
            .restored
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        restored
            .get(&r.addr)
            .filter(|b| b.len() == r.len as usize && crc(b) == r.crc)
            .cloned()
    }

    /// Puts back value extent `r`, whose bytes (checked against it by the caller)
    /// recovery found logged in the WAL but not in its segment: written into the
    /// segment (the open that recovers syncs every segment before it logs anything,
    /// and the WAL holding the bytes is deleted only after a checkpoint synced them
    /// again), or, on a read-only open, which must not write, kept in memory and read
    /// in their place.
    pub(crate) fn restore(&self, r: BlockRef, bytes: &[u8]) -> Result<()> {
        if self.read_only {
            self.restored
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(r.addr, bytes.to_vec());
            return Ok(());
        }
        let file = self.file(r.addr.segment()).ok_or_else(|| {
            Error::corrupted(
                "value extent",
                format!("{:?} points into missing segment", r.addr),
            )
        })?;
        file.write_all_at(bytes, r.addr.offset())?;
        lock(&self.unsynced).all.insert(r.addr.segment());
        Ok(())
    }

    /// Reads `len` bytes at `addr` without a checksum to check them against: for a
    /// caller that checks them itself, or only guesses with them (the cleaner's
    /// read-ahead, which knows a block's address and length from its back
    /// references but not its checksum).
    pub(crate) fn read_span(&self, addr: Addr, len: u32, what: &'static str) -> Result<Vec<u8>> {
        let file = self.file(addr.segment()).ok_or_else(|| {
            let seg = addr.segment();
            let detail = match self.strays.get(&seg) {
                Some(why) => format!(
                    "{addr:?} points into {}, which was ignored as not a segment of this store: {why}",
                    seg.file_name()
                ),
                None => format!("{addr:?} points into missing segment {}", seg.file_name()),
            };
            Error::corrupted(what, detail)
        })?;
        let mut buf = vec![0u8; len as usize];
        if addr.offset() < SEGMENT_HEADER_SIZE {
            return Err(Error::corrupted(
                what,
                format!("{addr:?} points into a segment header"),
            ));
        }
        file.read_exact_at(&mut buf, addr.offset()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::corrupted(
                    what,
                    format!("{addr:?}+{len} lies past the end of its segment"),
                )
            } else {
                e.into()
            }
        })?;
        Ok(buf)
    }

    /// Tells the OS its cached copy of the block at `r` is not needed: the caller
    /// caches the block itself (the page cache, on a leaf's second read).
    pub(crate) fn forget_cached(&self, r: BlockRef) {
        if let Some(file) = self.file(r.addr.segment()) {
            file.forget_cached(r.addr.offset(), u64::from(r.len));
        }
    }

    /// Asks the OS to read `len` bytes at `addr` in the background: blocks about to
    /// be read in turn (general segments get no read-ahead of the OS's own).
    pub(crate) fn will_need(&self, addr: Addr, len: u64) {
        let Some(file) = self.file(addr.segment()) else {
            return;
        };
        // Linux reads at most the larger of the device's largest request and the
        // file's read-ahead window per request (128 KiB by default) and ignores the
        // rest: ask in pieces it reads whole.
        let mut at = addr.offset();
        let end = at + len;
        while at < end {
            let n = (end - at).min(WILL_NEED_CHUNK);
            file.will_need(at, n);
            at += n;
        }
    }

    /// [`Segments::will_need`] for each block (address and length), in the order
    /// given, neighbours in a file (in either direction: blocks written together lie
    /// back to back) asked for in one request.
    pub(crate) fn will_need_blocks(&self, blocks: impl IntoIterator<Item = (Addr, u32)>) {
        let mut run: Option<(Addr, u64)> = None;
        for (addr, len) in blocks {
            let len = u64::from(len);
            let same = |at: Addr| at.segment() == addr.segment();
            run = match run {
                Some((at, n)) if same(at) && at.offset() + n == addr.offset() => {
                    Some((at, n + len))
                }
                Some((at, n)) if same(at) && addr.offset() + len == at.offset() => {
                    Some((addr, n + len))
                }
                other => {
                    if let Some((at, n)) = other {
                        self.will_need(at, n);
                    }
                    Some((addr, len))
                }
            };
        }
        if let Some((at, n)) = run {
            self.will_need(at, n);
        }
    }

    /// Whether segment `id` is one of this store's (found at open or made since;
    /// not a stray).
    pub(crate) fn contains(&self, id: SegmentId) -> bool {
        self.file(id).is_some()
    }

    fn file(&self, id: SegmentId) -> Option<Arc<dyn VFile>> {
        self.files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Makes every value extent appended so far durable. Callers are serialised by
    /// the WAL.
    pub(crate) fn sync_values(&self) -> Result<()> {
        self.start_sync_values().finish()
    }

    /// Starts making every value extent appended so far durable, on a helper thread
    /// where the file system lets syncs overlap; [`ValuesSync::finish`] waits for it.
    /// The WAL's group commit writes and syncs its records meanwhile, so a record may
    /// be durable before the extents it names are: the group is acknowledged only
    /// once both are, and recovery checks the extents of the records it cannot tell
    /// were acknowledged (`recovery`'s replay). Callers are serialised by the WAL.
    pub(crate) fn start_sync_values(&self) -> ValuesSync<'_> {
        let ids = lock(&self.unsynced).values_taken();
        self.start_sync_of(&ids)
    }

    /// How the next group commit makes every value extent written so far durable,
    /// which it takes on (callers are serialised by the WAL): their bytes logged in
    /// the WAL if they are few ([`LOG_VALUES_MAX`]) and in the page cache, else an
    /// fsync of their segments. A logged write's segment stays in the set the next
    /// checkpoint syncs ([`Segments::sync`]), which it does before the log that
    /// holds the bytes may be deleted.
    pub(crate) fn plan_values_sync(&self) -> ValuesPlan {
        let mut unsynced = lock(&self.unsynced);
        match unsynced.ranges.take() {
            Some(ranges) => {
                unsynced.values_taken();
                ValuesPlan::Log(ranges)
            }
            None => ValuesPlan::Sync(unsynced.values_taken()),
        }
    }

    /// Starts fsyncing the data segments `ids` (a [`ValuesPlan::Sync`]), as
    /// [`Segments::start_sync_values`] does.
    pub(crate) fn start_sync_of(&self, ids: &BTreeSet<SegmentId>) -> ValuesSync<'_> {
        let appended = self.since_sync.swap(0, Ordering::Relaxed);
        if appended > 0 {
            self.sync_gap.store(appended, Ordering::Relaxed);
        }
        let files = ids.iter().filter_map(|id| self.file(*id)).collect();
        ValuesSync {
            segments: self,
            pending: self.sync_helper.start(files),
        }
    }

    /// Makes every append so far durable. Callers are serialised here: one that
    /// finds nothing left to sync returns only once the syncs of the appends another
    /// caller took are done.
    pub(crate) fn sync(&self) -> Result<()> {
        let _syncing = lock(&self.syncing);
        self.check_syncs()?;
        let pending = std::mem::take(&mut lock(&self.unsynced).all);
        for id in &pending {
            if let Some(f) = self.file(*id) {
                if let Err(e) = f.sync() {
                    self.note_sync_failure(&e);
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Records a failed fsync of a segment file: every sync fails from now on.
    fn note_sync_failure(&self, e: &std::io::Error) {
        let _ = self.sync_failed.set(e.to_string());
    }

    /// Whether an fsync of a segment file has failed in this process.
    pub(crate) fn syncs_failed(&self) -> bool {
        self.sync_failed.get().is_some()
    }

    /// Fails if an fsync of a segment file has failed in this process.
    fn check_syncs(&self) -> Result<()> {
        match self.sync_failed.get() {
            Some(why) => Err(Error::Poisoned(format!(
                "an earlier fsync of a segment failed: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Fsyncs every segment file (after recovery, which may have read blocks that were
    /// written but never synced by a process that then died).
    pub(crate) fn sync_all(&self) -> Result<()> {
        let files: Vec<_> = self
            .files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for f in files {
            f.sync().inspect_err(|e| self.note_sync_failure(e))?;
        }
        Ok(())
    }

    /// Ends the active general segment: later appends of nodes go to a new one (the
    /// defragmenter lays its copies out from a fresh segment). The new one is
    /// created by the next append, so a seal leaves no empty file behind.
    pub(crate) fn seal(&self) {
        assert!(!self.read_only, "seal on a read-only store");
        Self::close_stream(&mut self.appender(Kind::General));
    }

    /// Ends the active data segment: later appends of data go to a new one, and this
    /// one, no longer growing, can be deleted once emptied (a drop's blocks may be in
    /// it).
    pub(crate) fn seal_data(&self) {
        assert!(!self.read_only, "seal on a read-only store");
        Self::close_stream(&mut self.appender(Kind::Data));
    }

    /// Ends whichever stream's active segment `id` is, if either: the cleaner does
    /// this before it moves the live blocks out of a segment that was taking appends.
    pub(crate) fn seal_if_active(&self, id: SegmentId) {
        assert!(!self.read_only, "seal on a read-only store");
        for kind in Kind::ALL {
            let mut app = self.appender(kind);
            if app.active.as_ref().is_some_and(|(a, _)| *a == id) {
                Self::close_stream(&mut app);
            }
        }
    }

    /// Seals the general stream unless its segment is the newest file: then what is
    /// written next (the cleaner's copies, the metadata of its checkpoints) lands past
    /// every segment the cleaner may empty, none of which is then the newest file
    /// kept to stop ids from being reused ([`Segments::is_highest`]).
    pub(crate) fn seal_unless_newest(&self) {
        let mut app = self.appender(Kind::General);
        let newest = app
            .active
            .as_ref()
            .is_some_and(|(id, _)| self.is_highest(*id));
        if !newest {
            Self::close_stream(&mut app);
        }
    }

    /// Makes `app`'s next append start a new segment.
    fn close_stream(app: &mut Appender) {
        Self::cut_tail(app);
        app.active = None;
        app.resume = None;
    }

    /// Cuts `app`'s active segment at its last block, which it no longer takes
    /// appends past. A data segment filled with zeros ahead, or made from a spare,
    /// ends where its blocks do: what is past them (zeros, a spare's old bytes) would
    /// count as dead bytes. Every append staged to it lies below `end`. If this
    /// fails, or a crash comes first, those bytes stay dead, cleaned like any others.
    fn cut_tail(app: &Appender) {
        if let Some((_, file)) = &app.active {
            if file.len().is_ok_and(|len| len > app.end) {
                let _ = file.set_len(app.end);
            }
        }
    }

    /// Whether `id` is the segment file with the highest id, the one that keeps ids
    /// from being reused: never deleted, even when empty, until a newer one exists.
    pub(crate) fn is_highest(&self, id: SegmentId) -> bool {
        let files = self
            .files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        files.keys().next_back() == Some(&id)
    }

    /// Whether `id` is a segment taking appends now (of either stream).
    pub(crate) fn is_active(&self, id: SegmentId) -> bool {
        Kind::ALL.iter().any(|&kind| {
            self.appender(kind)
                .active
                .as_ref()
                .is_some_and(|(a, _)| *a == id)
        })
    }

    /// The segments appends may still reach from now on (see [`AppendFence`]).
    ///
    /// A data stream that has not appended since the open gives up continuing its
    /// newest segment (its next append starts a new one): a process that writes no
    /// data (a `clean`, a `shrink`) must not keep a data segment it emptied from
    /// being deleted. The general stream keeps it: the checkpoint taking the fence
    /// appends to it at once.
    pub(crate) fn fence(&self) -> AppendFence {
        // Both appenders are held to the end (general, then data: no other code
        // holds both): a stream that rolled to a new segment after its appender was
        // read and before `next_id` is would take an id below `next` and, if it has
        // not pinned it yet, be missed by every part of the fence, and a segment a
        // transaction is filling could then be found empty and deleted.
        let mut general = self.appender(Kind::General);
        let mut data = self.appender(Kind::Data);
        data.resume = None;
        self.data_since_fence.store(0, Ordering::Relaxed);
        let growing = [&mut general, &mut data]
            .map(|app| app.active.as_ref().map(|(id, _)| *id).or(app.resume));
        let next = lock(&self.next_id);
        // A prepared data segment will take appends although it is not active yet.
        let prepared = *lock(&self.prepared_id);
        let pinned = lock(&self.pins).keys().copied().collect();
        AppendFence {
            growing,
            prepared,
            next: SegmentId(*next),
            pinned,
        }
    }

    /// The segment general appends go to now or will go to next: the active one, else
    /// the one they will continue, else the next id to be created.
    pub(crate) fn newest(&self) -> SegmentId {
        let app = self.appender(Kind::General);
        if let Some((id, _)) = &app.active {
            return *id;
        }
        app.resume.unwrap_or(SegmentId(*lock(&self.next_id)))
    }

    /// The files named like segments that are not segments of this store, with what
    /// is wrong with each: ignored (see the module docs).
    pub(crate) fn strays(&self) -> &BTreeMap<SegmentId, String> {
        &self.strays
    }

    /// Turns writing zeros ahead of the data stream on or off (see
    /// [`Segments::prepare_data_segment`]).
    pub(crate) fn set_zeros_ahead(&self, on: bool) {
        self.zeros_ahead.store(on, Ordering::Relaxed);
    }

    /// `Options::log_small_values`.
    pub(crate) fn set_log_small_values(&self, on: bool) {
        self.log_small_values.store(on, Ordering::Relaxed);
    }

    /// Cuts the zeros written ahead ([`Segments::prepare_data_segment`]) off the
    /// active data segment and the prepared one, at a close (no appends after it):
    /// the next process would count them as dead bytes, and a prepared segment cut
    /// back to its header is continued by the next process's appends. Best effort:
    /// zeros left are dead bytes, cleaned like any others.
    pub(crate) fn trim_zeros(&self) {
        Self::cut_tail(&self.appender(Kind::Data));
        if let Some(p) = lock(&self.prepared).as_mut() {
            if p.zeroed > SEGMENT_HEADER_SIZE && p.file.set_len(SEGMENT_HEADER_SIZE).is_ok() {
                p.zeroed = SEGMENT_HEADER_SIZE;
            }
        }
    }

    /// Ids and sizes of every segment file: where its blocks end, which for the data
    /// segment taking appends may be short of the file's end (zeros written ahead, a
    /// spare's old bytes: [`Segments::prepare_data_segment`]; the segment prepared
    /// ahead is not listed until the stream takes it). The store's footprint counts
    /// the files' lengths.
    pub(crate) fn sizes(&self) -> Result<Vec<(SegmentId, u64)>> {
        // The list taken under the data stream's lock (the order `roll` takes them
        // in), so that a roll cannot come between the active segment's end and it.
        let (data_end, files) = {
            let app = self.appender(Kind::Data);
            let files: Vec<_> = self
                .files
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .map(|(id, f)| (*id, f.clone()))
                .collect();
            (app.active.as_ref().map(|(id, _)| (*id, app.end)), files)
        };
        files
            .into_iter()
            .map(|(id, f)| {
                let len = f.len()?;
                let len = match data_end {
                    Some((active, end)) if active == id => len.min(end),
                    _ => len,
                };
                Ok((id, len))
            })
            .collect()
    }

    /// Cuts an empty segment that must be kept (the one with the highest id) back to
    /// its header. The caller guarantees nothing reachable lives in it and that no
    /// append can reach it. Best effort: what stays is dead bytes; a crash may bring
    /// them back (the cut is not synced), the same.
    pub(crate) fn cut_to_header(&self, id: SegmentId) {
        // A reader in another process may still read it (then it goes whole, once a
        // newer segment exists).
        if self.vfs.readers_present() {
            return;
        }
        if let Some(file) = self.file(id) {
            if file.len().is_ok_and(|len| len > SEGMENT_HEADER_SIZE) {
                let _ = file.set_len(SEGMENT_HEADER_SIZE);
            }
        }
    }

    /// Whether segment `id`'s file holds no more than its header (cut back by
    /// [`Segments::cut_to_header`], or never written to).
    pub(crate) fn is_cut(&self, id: SegmentId) -> bool {
        self.file(id)
            .is_some_and(|f| f.len().is_ok_and(|len| len <= SEGMENT_HEADER_SIZE))
    }

    /// Deletes an empty segment, or keeps its file as a spare (module docs, "Spare
    /// files"). The caller guarantees nothing reachable lives in it, and syncs the
    /// directory.
    pub(crate) fn delete(&self, id: SegmentId) -> Result<()> {
        assert!(!self.is_active(id), "deleting an active segment");
        assert!(
            !self.is_highest(id),
            "deleting the segment with the highest id"
        );
        let file = self
            .files
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        {
            let mut unsynced = lock(&self.unsynced);
            unsynced.all.remove(&id);
            unsynced.values.remove(&id);
            // Its extents are dead: no record can need them logged.
            if let Some(ranges) = &mut unsynced.ranges {
                ranges.retain(|r| r.addr.segment() != id);
            }
        }
        let name = id.file_name();
        if let Some(len) = file.and_then(|f| f.len().ok()) {
            let mut spares = lock(&self.spares);
            let room = (spares.len() as u64) < self.spare_limit.load(Ordering::Relaxed);
            if room && len >= SPARE_MIN_BYTES && !self.read_only {
                let spare = spare_name(id);
                self.vfs.rename(&name, &spare)?;
                spares.push((spare, len));
                return Ok(());
            }
        }
        self.vfs.remove(&name)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;
