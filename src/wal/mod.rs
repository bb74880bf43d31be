//! The write-ahead log: logical redo records of committed transactions.
//!
//! The log is a sequence of files `wal-<gen>.log`. A checkpoint *rotates* the log:
//! records committed before its freeze point are in generation `g` and are covered by
//! the checkpoint; later ones go to `g + 1`. The superblock names the first generation
//! recovery must replay; files below it are deleted once that superblock is durable.
//!
//! Record framing (little-endian, see docs/FORMAT.md):
//! ```text
//! len u32 | crc u32 | lsn u64 | synced_lsn u64 | kind u8 | reserved [u8; 3] | payload[len]
//! ```
//! (`record.rs` owns the framing, `payload.rs` the kinds and payloads as [`Record`],
//! `files.rs` the file names and reading generations back.)
//! `crc` is CRC-32C over the generation number (8 bytes, the file's salt), the header
//! bytes after `crc`, and the payload. A record from another generation (say a stale
//! one) can therefore never validate. Records are numbered by consecutive LSNs.
//!
//! Recovery policy: read records until the first that is short, fails its checksum or
//! breaks LSN continuity. That is the torn tail of a crash, and it is ignored: such a
//! record was never acknowledged, because commit returns only after the fsync that
//! covers the whole record.
//!
//! Group commit: committers append records to an in-memory buffer and wait; the first
//! waiter with no sync in flight becomes the leader, writes the whole buffer and
//! fsyncs once for everybody.

#[cfg(test)]
mod buffer_tests;
mod files;
mod payload;
#[cfg(test)]
mod race_tests;
mod record;

pub(crate) use files::{
    file_name, generations, remove_below, spare_bytes, Generation, Generations, SPARE_FILE,
};
pub(crate) use payload::{decode_values, BatchWriter, Op, Record, VersionOp};

use crate::error::{Error, Result};
use crate::format::Lsn;
use crate::io::{StoreLock, VFile, Vfs};
use crate::space::{Segments, UnsyncedValues, ValuesPlan, ValuesSync};
use crate::sync::lock;
use record::{RecordHeader, RECORD_HEADER_SIZE};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A new log file (when no spare exists) is filled with this many zero bytes first,
/// so that commits overwrite blocks the file already owns (see [`SPARE_FILE`]). Zeros
/// read as the end of the log (a record is at least a batch header long).
pub(crate) const PREALLOC_BYTES: usize = 4 << 20;

/// A log file is kept written (with zeros) at least this far past its last record,
/// in steps of this size: a group commit then overwrites blocks the file already
/// has, and its fdatasync commits no file-system metadata. A group that logs value
/// bytes writes tens of KiB, so without it nearly every fsync would also grow the
/// file (a journal commit on ext4: measured 0.20 against 0.11 ms per fdatasync).
const ZEROS_AHEAD_BYTES: u64 = 16 << 20;

/// Buffered records past this many bytes are written out by a committer that does not
/// sync ([`Wal::write_out`]).
const WRITE_OUT_BYTES: usize = 1 << 20;

/// The largest buffer kept for reuse ([`State::recycle`]): room for a write-out's
/// worth of records and the record that passed it.
const SPARE_MAX: usize = 4 * WRITE_OUT_BYTES;

struct State {
    gen: u64,
    /// The current generation's file, created lazily at its first write.
    file: Option<Arc<dyn VFile>>,
    /// Where the next write lands in `file`.
    file_end: u64,
    /// Records appended but not yet written.
    buf: Vec<u8>,
    /// An empty buffer with room, given back by the last write ([`State::recycle`]):
    /// the next `buf`, so that appends under the writer lock do not grow a buffer
    /// from nothing after every write (copying it at each doubling into fresh memory,
    /// whose page faults took appends over 1 ms while a snapshot waited).
    spare: Vec<u8>,
    /// A record not yet written was appended by a thread that may use the reserve
    /// (a drop's): whichever thread writes it may too. The write of a group is the
    /// leader's, which may be a client's commit thread: without this, a drop's record
    /// on a full disk failed the log for good when another thread led its group.
    reserve_allowed: bool,
    /// Records of this generation were written out ([`Wal::write_out`]) and not
    /// synced since: a rotation must leave a tail even with `buf` empty, so that
    /// they are synced before any record of the next generation.
    written_unsynced: bool,
    /// The LSN of the last record in `buf` (or written).
    last_lsn: Lsn,
    synced_lsn: Lsn,
    sync_in_flight: bool,
    failed: Option<String>,
    /// Bytes of log not yet covered by a checkpoint (all live generations).
    bytes_since_checkpoint: u64,
    /// Bytes appended to the current generation.
    gen_bytes: u64,
    /// Records of rotated generations not yet written: the next group commit writes
    /// and syncs them before anything of the current generation (see
    /// [`Wal::rotate`]).
    rotated: Vec<Rotated>,
}

/// Buffered records taken for writing by the one writer in flight (a sync leader
/// or a write-out), with their place in the generation's file, reserved.
struct Outgoing {
    gen: u64,
    file: Option<Arc<dyn VFile>>,
    at: u64,
    buf: Vec<u8>,
}

impl State {
    /// Keeps `written`, emptied, as the next buffer, unless one with as much room is
    /// kept already or it is larger than [`SPARE_MAX`] (a rare large record's).
    fn recycle(&mut self, mut written: Vec<u8>) {
        if written.capacity() <= SPARE_MAX && written.capacity() > self.spare.capacity() {
            written.clear();
            self.spare = written;
        }
    }
}

impl Outgoing {
    fn take(st: &mut State) -> Outgoing {
        let buf = std::mem::replace(&mut st.buf, std::mem::take(&mut st.spare));
        let file = st.file.clone();
        if file.is_none() {
            st.file_end = 0;
        }
        let at = st.file_end;
        st.file_end += buf.len() as u64;
        Outgoing {
            gen: st.gen,
            file,
            at,
            buf,
        }
    }
}

/// Writes zeros past the end of `file` if a write up to `end` would grow it (see
/// [`ZEROS_AHEAD_BYTES`]). A full disk leaves the file to grow with its records
/// (the zeros never take the reserve: a drop's record needs only its own bytes).
fn zeros_ahead(file: &dyn VFile, end: u64) -> Result<()> {
    crate::io::without_reserve(|| write_zeros_ahead(file, end))
}

fn write_zeros_ahead(file: &dyn VFile, end: u64) -> Result<()> {
    let len = file.len()?;
    if end <= len {
        return Ok(());
    }
    let to = (end + ZEROS_AHEAD_BYTES).next_multiple_of(1 << 20);
    let zeros = vec![0u8; 1 << 20];
    let mut at = len;
    while at < to {
        let n = (to - at).min(zeros.len() as u64);
        match file.write_all_at(&zeros[..n as usize], at) {
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => return Ok(()),
            other => other?,
        }
        at += n;
    }
    Ok(())
}

/// How a group commit makes the value extents its records name durable (see
/// [`Segments::plan_values_sync`]).
enum Values {
    Nothing,
    /// Their bytes go into the group's write, as a values record with this header,
    /// in the room reserved for it.
    Log {
        ranges: Vec<UnsyncedValues>,
        header: RecordHeader,
        payload_len: usize,
    },
    /// Their segments are fsynced beside it.
    Sync(std::collections::BTreeSet<crate::format::SegmentId>),
}

/// The unwritten tail of a rotated generation.
struct Rotated {
    gen: u64,
    /// Its file, if a group commit already made it.
    file: Option<Arc<dyn VFile>>,
    /// Where `buf` goes in the file.
    at: u64,
    buf: Vec<u8>,
}

pub(crate) struct Wal {
    vfs: Arc<dyn Vfs>,
    state: Mutex<State>,
    synced: Condvar,
    /// Tells readers in other processes how far the log is durable.
    publisher: Arc<dyn StoreLock>,
}

impl Wal {
    /// A log that will write generation `gen`, whose first record follows `last_lsn`.
    pub(crate) fn new(
        vfs: Arc<dyn Vfs>,
        publisher: Arc<dyn StoreLock>,
        gen: u64,
        last_lsn: Lsn,
        bytes_since_checkpoint: u64,
    ) -> Wal {
        let state = State {
            gen,
            file: None,
            file_end: 0,
            buf: Vec::new(),
            spare: Vec::new(),
            written_unsynced: false,
            reserve_allowed: false,
            last_lsn,
            synced_lsn: last_lsn,
            sync_in_flight: false,
            failed: None,
            bytes_since_checkpoint,
            gen_bytes: 0,
            rotated: Vec::new(),
        };
        Wal {
            vfs,
            state: Mutex::new(state),
            synced: Condvar::new(),
            publisher,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn last_lsn(&self) -> Lsn {
        self.lock().last_lsn
    }

    pub(crate) fn bytes_since_checkpoint(&self) -> u64 {
        self.lock().bytes_since_checkpoint
    }

    /// Appends a record to the buffer. The caller holds the writer lock, so LSNs are
    /// appended in order.
    pub(crate) fn append(&self, lsn: Lsn, rec: &Record<'_>) -> Result<()> {
        let mut st = self.lock();
        if let Some(why) = &st.failed {
            return Err(Error::Poisoned(why.clone()));
        }
        assert_eq!(
            lsn,
            st.last_lsn.next(),
            "WAL records must be appended in LSN order"
        );
        let gen = st.gen;
        let before = st.buf.len();
        let header = RecordHeader {
            lsn,
            synced_lsn: st.synced_lsn,
            kind: rec.kind(),
        };
        record::encode(&mut st.buf, gen, header, &rec.payload());
        st.reserve_allowed |= crate::io::reserve_allowed_here();
        let added = (st.buf.len() - before) as u64;
        st.bytes_since_checkpoint += added;
        st.gen_bytes += added;
        st.last_lsn = lsn;
        Ok(())
    }

    /// Records that `lsn` was committed by the checkpoint of superblock generation
    /// `generation` (it has no batch record). Called once that checkpoint's
    /// superblock is durable (never before: any sync may write the buffer), by the
    /// committer still holding the writer lock, so the marker opens the generation
    /// the freeze started.
    pub(crate) fn append_checkpoint_commit(&self, lsn: Lsn, generation: u64) -> Result<()> {
        self.append(lsn, &Record::CheckpointCommit { generation })
    }

    /// Returns once every record up to `lsn` is durable. Segment appends are synced
    /// first, so value extents named by those records are durable before the records.
    pub(crate) fn sync_to(&self, lsn: Lsn, segments: &Segments) -> Result<()> {
        let mut st = self.lock();
        loop {
            if st.synced_lsn >= lsn {
                return Ok(());
            }
            if let Some(why) = &st.failed {
                return Err(Error::Poisoned(why.clone()));
            }
            if st.sync_in_flight {
                st = self
                    .synced
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            st.sync_in_flight = true;
            let target = st.last_lsn;
            let rotated = std::mem::take(&mut st.rotated);
            let mut out = Outgoing::take(&mut st);
            let gen = out.gen;
            // Value extents written through the page cache, if few, go into this
            // group's write as a values record (room reserved for it here) instead
            // of being fsynced beside it: one write and one fsync for the group.
            let values = match segments.plan_values_sync() {
                ValuesPlan::Log(ranges) if ranges.is_empty() => Values::Nothing,
                ValuesPlan::Log(ranges) => {
                    let payload_len = payload::values_payload_len(ranges.iter().map(|r| r.len));
                    let len = (RECORD_HEADER_SIZE + payload_len) as u64;
                    st.file_end += len;
                    st.bytes_since_checkpoint += len;
                    st.gen_bytes += len;
                    let header = RecordHeader {
                        lsn: target,
                        synced_lsn: st.synced_lsn,
                        kind: payload::KIND_VALUES,
                    };
                    Values::Log {
                        ranges,
                        header,
                        payload_len,
                    }
                }
                ValuesPlan::Sync(ids) => Values::Sync(ids),
            };
            // The leader does its I/O without the lock, so others keep appending
            // (their records form the next group). That includes making the
            // generation's file at its first write (a rename and a directory sync, or
            // 4 MiB of zeros): every committer would otherwise wait for it.
            let allowed = std::mem::take(&mut st.reserve_allowed).then(crate::io::allow_reserve);
            drop(st);
            let result = self.file_of(&out).and_then(|file| {
                self.write_and_sync(&*file, out.at, &mut out.buf, gen, segments, rotated, values)
            });
            drop(allowed);
            st = self.lock();
            st.recycle(out.buf);
            st.sync_in_flight = false;
            // Published before any committer waiting on this sync returns: a reader in
            // another process then sees every acknowledged commit, and no other.
            match result.and_then(|()| Ok(self.publisher.publish_synced(target.0)?)) {
                Ok(()) => {
                    st.synced_lsn = st.synced_lsn.max(target);
                    // Its file is synced, written-out records included, unless a
                    // rotation came meanwhile (the tail it left syncs them).
                    if st.gen == gen {
                        st.written_unsynced = false;
                    }
                }
                Err(e) => st.failed = Some(e.to_string()),
            }
            self.synced.notify_all();
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the one call site hands over what it took under the lock"
    )]
    fn write_and_sync(
        &self,
        file: &dyn VFile,
        at: u64,
        buf: &mut Vec<u8>,
        gen: u64,
        segments: &Segments,
        rotated: Vec<Rotated>,
        values: Values,
    ) -> Result<()> {
        // Only the value extents records may name (checkpoint writes in flight are the
        // checkpoint's to sync): logged at the end of the group's write, or synced
        // beside it, and then the group is acknowledged once both are durable, and
        // recovery drops a record whose extents did not make it (no record after it
        // can say it was synced).
        let values = match values {
            Values::Nothing => None,
            Values::Sync(ids) => Some(segments.start_sync_of(&ids)),
            Values::Log {
                ranges,
                header,
                payload_len,
            } => {
                let entries = ranges
                    .iter()
                    .map(|r| Ok((r.addr, r.read()?)))
                    .collect::<std::io::Result<Vec<_>>>()?;
                let mut payload = Vec::with_capacity(payload_len);
                payload::encode_values(&mut payload, &entries);
                debug_assert_eq!(payload.len(), payload_len, "the room reserved for it");
                record::encode(buf, gen, header, &payload);
                None
            }
        };
        let records = (|| {
            // Earlier generations first: no record of this one may be durable while
            // one of theirs is not (replay reads them in order and stops at a gap).
            self.write_rotated(rotated)?;
            if !buf.is_empty() {
                zeros_ahead(file, at + buf.len() as u64)?;
                file.write_all_at(buf, at)?;
            }
            file.sync()?;
            Ok(())
        })();
        let values = values.map_or(Ok(()), ValuesSync::finish);
        records.and(values)
    }

    /// Writes the buffered records to the generation's file, without syncing them,
    /// once they pass [`WRITE_OUT_BYTES`] and no sync is in flight: committers that do
    /// not sync (deferred commits, a volume's writes between flushes) would otherwise
    /// grow the buffer until the next flush or checkpoint — up to the 512 MiB of log a
    /// checkpoint waits for, in memory, and copied whole at each doubling under the
    /// writer lock (a 5 ms stall for a snapshot of a busy volume at 32 MiB).
    ///
    /// Records then reach the file before the extents they name are synced, which is
    /// safe for the reason overlapped syncs are: recovery checks the extents of every
    /// record past the newest `synced_lsn`. Not while a rotated generation's tail is
    /// unwritten (it must reach the disk first: a later generation's records after a
    /// gap read as corruption): the next sync writes those. The generation's file is
    /// made here if no sync has made it yet, as a sync leader would.
    pub(crate) fn write_out(&self) -> Result<()> {
        let mut st = self.lock();
        if st.buf.len() < WRITE_OUT_BYTES
            || st.sync_in_flight
            || st.failed.is_some()
            || !st.rotated.is_empty()
        {
            return Ok(());
        }
        st.sync_in_flight = true;
        st.written_unsynced = true;
        let out = Outgoing::take(&mut st);
        let allowed = std::mem::take(&mut st.reserve_allowed).then(crate::io::allow_reserve);
        drop(st);
        let result = self
            .file_of(&out)
            .and_then(|file| Ok(file.write_all_at(&out.buf, out.at)?));
        drop(allowed);
        self.end_in_flight(result, Some(out.buf))
    }

    /// Writes and fsyncs the unwritten tails of rotated generations, oldest first.
    /// The caller leads a sync (`sync_in_flight`) and has synced the value extents.
    fn write_rotated(&self, rotated: Vec<Rotated>) -> Result<()> {
        for old in rotated {
            let file = match old.file {
                Some(f) => f,
                None => self.open_new(old.gen)?,
            };
            file.write_all_at(&old.buf, old.at)?;
            file.sync()?;
        }
        Ok(())
    }

    /// Makes the records of every rotated generation durable, and none of the
    /// current one's: what a checkpoint needs before its superblock (the records it
    /// covers, readable from the other slot should this one be damaged), without
    /// making durable a record that must not be before the superblock is (a large
    /// transaction's checkpoint-commit marker).
    pub(crate) fn sync_rotated(&self, segments: &Segments) -> Result<()> {
        let mut st = self.lock();
        loop {
            if let Some(why) = &st.failed {
                return Err(Error::Poisoned(why.clone()));
            }
            // A group commit in flight may have taken the tails this needs: wait for
            // it to finish them, then write what is left.
            if !st.sync_in_flight {
                if st.rotated.is_empty() {
                    return Ok(());
                }
                break;
            }
            st = self
                .synced
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st.sync_in_flight = true;
        let rotated = std::mem::take(&mut st.rotated);
        drop(st);
        let result = segments
            .sync_values()
            .and_then(|()| self.write_rotated(rotated));
        self.end_in_flight(result, None)
    }

    /// Ends the I/O a caller did as the one writer in flight (`sync_in_flight`, set
    /// by it): a failure poisons the log; everyone waiting for that writer wakes.
    /// Ends the write or sync in flight; `written` is its buffer, for reuse.
    fn end_in_flight(&self, result: Result<()>, written: Option<Vec<u8>>) -> Result<()> {
        let mut st = self.lock();
        if let Some(buf) = written {
            st.recycle(buf);
        }
        st.sync_in_flight = false;
        if let Err(e) = &result {
            st.failed = Some(e.to_string());
        }
        self.synced.notify_all();
        result
    }

    /// Hands generation `gen`'s file, just made by the sync leader without the lock,
    /// to whoever writes that generation next: the state, or, if a checkpoint's
    /// freeze rotated the log meanwhile, the rotated tail it left (whose records go
    /// after the leader's in the same file). No other leader can have made it: only
    /// one sync is in flight.
    fn attach(&self, gen: u64, file: &Arc<dyn VFile>) {
        let mut st = self.lock();
        if st.gen == gen {
            st.file.get_or_insert_with(|| Arc::clone(file));
        } else if let Some(tail) = st.rotated.iter_mut().find(|r| r.gen == gen) {
            tail.file.get_or_insert_with(|| Arc::clone(file));
        }
    }

    /// The file `out` goes to: the generation's, made now (off the lock) if no
    /// write has made it yet, and handed to whoever writes the generation next.
    fn file_of(&self, out: &Outgoing) -> Result<Arc<dyn VFile>> {
        match &out.file {
            Some(file) => Ok(Arc::clone(file)),
            None => self
                .open_new(out.gen)
                .inspect(|file| self.attach(out.gen, file)),
        }
    }

    /// Makes generation `gen`'s file, empty: the spare renamed, or a new one.
    fn open_new(&self, gen: u64) -> Result<Arc<dyn VFile>> {
        let name = file_name(gen);
        let file = if self.vfs.exists(&name)? {
            // A leftover of a crashed run: recovery already read what it held, and
            // this generation starts after it. Truncate so its records cannot be
            // mistaken for this run's (same salt).
            let f = self.vfs.open(&name)?;
            f.set_len(0)?;
            f
        } else if self.vfs.exists(SPARE_FILE)? {
            self.vfs.rename(SPARE_FILE, &name)?;
            let f = self.vfs.open(&name)?;
            files::trim_spare(&*f)?;
            f
        } else {
            let f = self.vfs.create(&name)?;
            let zeros = vec![0u8; PREALLOC_BYTES];
            match crate::io::without_reserve(|| f.write_all_at(&zeros, 0)) {
                // A nearly full disk: grow the file as records come instead,
                // so that a drop's small record still fits.
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => f.set_len(0)?,
                other => other?,
            }
            f.sync()?;
            f
        };
        self.vfs.sync_dir()?;
        Ok(file)
    }

    /// Starts generation `gen + 1`. Called at a checkpoint's freeze, under the writer
    /// lock, so no record is appended concurrently. Returns the generation that was
    /// closed.
    ///
    /// The closed generation's unwritten records are neither written nor fsynced
    /// here: the freeze holds every writer (and every snapshot) while it runs, and
    /// the value extents those records name must be synced first, which for a volume
    /// written without flushes is hundreds of MB. The next group commit does it all
    /// in order (`write_and_sync`: value extents, then the old generation, then the
    /// new), so no record is durable before the extents it names or before an
    /// earlier record; until then a crash loses only unacknowledged records, as
    /// always. The checkpoint needs none of them durable: once its superblock is,
    /// replay starts at `gen + 1`.
    ///
    /// Nor does it wait for a group commit in flight (which may be fsyncing hundreds of
    /// MB of value extents): that leader writes only the records it took, at the
    /// offsets it took, and the tail left here goes after them.
    pub(crate) fn rotate(&self) -> Result<u64> {
        let mut st = self.lock();
        if let Some(why) = &st.failed {
            return Err(Error::Poisoned(why.clone()));
        }
        let file = st.file.take();
        if !st.buf.is_empty() || st.written_unsynced {
            st.written_unsynced = false;
            let rotated = Rotated {
                gen: st.gen,
                file,
                at: st.file_end,
                buf: std::mem::take(&mut st.buf),
            };
            st.rotated.push(rotated);
        }
        let closed = st.gen;
        st.gen += 1;
        st.gen_bytes = 0;
        st.file = None;
        st.file_end = 0;
        Ok(closed)
    }

    /// After a checkpoint is durable: the log it covers is dead.
    pub(crate) fn checkpoint_done(&self) {
        let mut st = self.lock();
        st.bytes_since_checkpoint = st.gen_bytes;
    }

    /// Marks the log failed (after an I/O error elsewhere left the store poisoned).
    pub(crate) fn poison(&self, why: &str) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some(why.to_owned());
        }
        self.synced.notify_all();
    }
}
