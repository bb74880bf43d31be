//! Segment files: append, read by reference, sync, delete.
//!
//! A segment file starts with a 32-byte header (magic, format version, segment id,
//! checksum); blocks follow, packed, at any byte offset. The active segment takes
//! appends until it passes `SEGMENT_TARGET_BYTES`, then a new one is created (and the
//! directory synced, so the new file survives a crash before anything in it is
//! relied on).
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
use crate::io::{VFile, Vfs};
use crate::sync::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

const SEGMENT_MAGIC: &[u8; 8] = b"CAMBSEG\0";

// Header layout: the byte offset of each field. docs/FORMAT.md has the same table, and
// `crate::format_tests` checks the two against each other.
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_FORMAT_VERSION: usize = 8;
pub(crate) const OFF_SEGMENT_ID: usize = 12;
pub(crate) const OFF_RESERVED: usize = 16;
/// The checksum covers every header byte before it.
pub(crate) const OFF_CRC: usize = 28;
/// Blocks start here.
pub(crate) const SEGMENT_HEADER_SIZE: u64 = 32;
const HEADER_LEN: usize = SEGMENT_HEADER_SIZE as usize;

// The fields are contiguous, each as wide as its type, and fill exactly the header.
const _: () = assert!(OFF_MAGIC == 0);
const _: () = assert!(OFF_MAGIC + SEGMENT_MAGIC.len() == OFF_FORMAT_VERSION);
const _: () = assert!(OFF_FORMAT_VERSION + size_of::<u32>() == OFF_SEGMENT_ID);
const _: () = assert!(OFF_SEGMENT_ID + size_of::<u32>() == OFF_RESERVED);
const _: () = assert!(OFF_RESERVED + 12 == OFF_CRC);
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
            ("reserved", OFF_RESERVED),
            ("crc", OFF_CRC),
        ],
        HEADER_LEN,
    );
}
/// A segment stops taking appends past this size. Big enough that a checkpoint is
/// one long sequential write, small enough that an emptied segment returns its space.
pub(crate) const SEGMENT_TARGET_BYTES: u64 = 64 << 20;

struct Appender {
    active: Option<(SegmentId, Arc<dyn VFile>)>,
    end: u64,
    next_id: u32,
    /// Segments written since their last sync.
    unsynced: BTreeSet<SegmentId>,
    /// Segments holding value extents written since the WAL last synced them: a WAL
    /// record naming an extent must not become durable before the extent does. Kept
    /// apart from `unsynced` so that a commit fsyncs only what its records depend on,
    /// not the nodes a background checkpoint is writing meanwhile. Only the WAL's
    /// (serialised) group-commit sync clears it.
    values_unsynced: BTreeSet<SegmentId>,
}

pub(crate) struct Segments {
    vfs: Arc<dyn Vfs>,
    files: RwLock<BTreeMap<SegmentId, Arc<dyn VFile>>>,
    /// Files found with no header or part of one (see the module docs): never
    /// continued by appends.
    unwritten: BTreeSet<SegmentId>,
    /// Files named like segments that are not (see the module docs), with what is
    /// wrong with each. Not in `files`.
    strays: BTreeMap<SegmentId, String>,
    appender: Mutex<Appender>,
    read_only: bool,
}

/// What a segment file's header says about the file (see the module docs).
enum Header {
    Valid,
    Unwritten,
    Stray(String),
}

impl Segments {
    /// Opens every segment file in the directory, checking each header; strays are
    /// set aside. Appends go to the end of the newest segment (never over anything
    /// already there: a crash may have left blocks a WAL record refers to). A name
    /// that is not a regular file (a directory, a dangling link) fails the open.
    pub(crate) fn open(vfs: Arc<dyn Vfs>, read_only: bool) -> Result<Segments> {
        let mut ids: Vec<SegmentId> = vfs
            .list()?
            .iter()
            .filter_map(|n| SegmentId::parse_file_name(n))
            .collect();
        ids.sort();
        let mut files = BTreeMap::new();
        let mut unwritten = BTreeSet::new();
        let mut strays = BTreeMap::new();
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
                Header::Valid => {}
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
        let appender = Appender {
            active: None,
            end: 0,
            next_id,
            unsynced: BTreeSet::new(),
            values_unsynced: BTreeSet::new(),
        };
        Ok(Segments {
            vfs,
            files: RwLock::new(files),
            unwritten,
            strays,
            appender: Mutex::new(appender),
            read_only,
        })
    }

    /// Reads and classifies the header of segment `id`'s file.
    fn check_header(file: &dyn VFile, id: SegmentId) -> Result<Header> {
        let expected = Self::header(id);
        let len = file.len()?;
        let present = usize::try_from(len).map_or(HEADER_LEN, |l| l.min(HEADER_LEN));
        let mut buf = [0u8; HEADER_LEN];
        #[allow(
            clippy::indexing_slicing,
            reason = "present is at most HEADER_LEN, the buffer's length"
        )]
        let read = &mut buf[..present];
        file.read_exact_at(read, 0)?;
        let torn = read
            .iter()
            .zip(&expected)
            .all(|(byte, want)| *byte == 0 || byte == want);
        if len <= SEGMENT_HEADER_SIZE && torn && read != expected {
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
        Ok(Header::Valid)
    }

    fn header(id: SegmentId) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[OFF_MAGIC..OFF_FORMAT_VERSION].copy_from_slice(SEGMENT_MAGIC);
        h[OFF_FORMAT_VERSION..OFF_SEGMENT_ID].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[OFF_SEGMENT_ID..OFF_RESERVED].copy_from_slice(&id.0.to_le_bytes());
        // The reserved bytes stay zero.
        let c = crc(&h[..OFF_CRC]);
        h[OFF_CRC..].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Starts a new segment file. Its creation is made durable at once.
    fn roll(&self, app: &mut Appender) -> Result<()> {
        let id = SegmentId(app.next_id);
        app.next_id += 1;
        let file = self.vfs.create(&id.file_name())?;
        file.write_all_at(&Self::header(id), 0)?;
        file.sync()?;
        self.vfs.sync_dir()?;
        self.files
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, file.clone());
        app.active = Some((id, file));
        app.end = SEGMENT_HEADER_SIZE;
        Ok(())
    }

    fn ensure_active(&self, app: &mut Appender, len: u64) -> Result<()> {
        let full = app.end > SEGMENT_HEADER_SIZE && app.end + len > SEGMENT_TARGET_BYTES;
        if app.active.is_none() {
            // After open, continue the newest segment if it has room, it has its
            // header, and no stray has a higher id (appends always go to the
            // highest-numbered segment).
            let newest = self
                .files
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .next_back()
                .map(|(id, f)| (*id, f.clone()));
            if let Some((id, file)) = newest {
                let end = file.len()?.max(SEGMENT_HEADER_SIZE);
                let continuable = !self.unwritten.contains(&id) && id.0 + 1 == app.next_id;
                if end + len <= SEGMENT_TARGET_BYTES && continuable {
                    app.active = Some((id, file));
                    app.end = end;
                    return Ok(());
                }
            }
            return self.roll(app);
        }
        if full {
            return self.roll(app);
        }
        Ok(())
    }

    /// Appends `data` as one block and returns its reference. Not durable until
    /// [`Segments::sync`].
    pub(crate) fn append(&self, data: &[u8]) -> Result<BlockRef> {
        let (addr, _) = self.append_many(data)?;
        Ok(BlockRef {
            addr,
            len: crate::format::len_u32(data.len()),
            crc: crc(data),
        })
    }

    /// Appends a value extent that a WAL record will name: like [`Segments::append`],
    /// and [`Segments::sync_values`] makes it durable.
    pub(crate) fn append_value(&self, data: &[u8]) -> Result<BlockRef> {
        let r = self.append(data)?;
        // After the write: a sync that takes the set before this insert did not cover
        // this extent, and the next one will.
        lock(&self.appender)
            .values_unsynced
            .insert(r.addr.segment());
        Ok(r)
    }

    /// Appends several value extents in one write (what [`Segments::append_value`]
    /// does for each, at the cost of one system call); returns their references in
    /// order. `scratch` is reused to lay them out back to back.
    pub(crate) fn append_values(
        &self,
        values: &[&[u8]],
        scratch: &mut Vec<u8>,
    ) -> Result<Vec<BlockRef>> {
        match values {
            [] => return Ok(Vec::new()),
            // One value needs no laying out (the common 4 KiB write).
            [one] => return Ok(vec![self.append_value(one)?]),
            _ => {}
        }
        scratch.clear();
        for v in values {
            scratch.extend_from_slice(v);
        }
        let (first, segment) = self.append_many(scratch)?;
        lock(&self.appender).values_unsynced.insert(segment);
        let mut at = 0u64;
        let refs = values
            .iter()
            .map(|v| {
                let r = BlockRef {
                    addr: Addr::new(segment, first.offset() + at),
                    len: crate::format::len_u32(v.len()),
                    crc: crc(v),
                };
                at += v.len() as u64;
                r
            })
            .collect();
        Ok(refs)
    }

    /// Appends a buffer holding several blocks; returns the address of its first byte
    /// (blocks inside are at that address plus their offset in the buffer) and the
    /// segment it went to.
    pub(crate) fn append_many(&self, data: &[u8]) -> Result<(Addr, SegmentId)> {
        assert!(!self.read_only, "append on a read-only store");
        let mut app = lock(&self.appender);
        let len = data.len() as u64;
        self.ensure_active(&mut app, len)?;
        let (id, file) = app.active.clone().expect("ensured");
        let at = app.end;
        file.write_all_at(data, at)?;
        app.end += len;
        app.unsynced.insert(id);
        Ok((Addr::new(id, at), id))
    }

    /// Reads a block and checks its checksum.
    pub(crate) fn read(&self, r: BlockRef, what: &'static str) -> Result<Vec<u8>> {
        let buf = self.read_span(r.addr, r.len, what)?;
        if crc(&buf) != r.crc {
            return Err(Error::corrupted(
                what,
                format!("checksum mismatch at {:?} ({} bytes)", r.addr, r.len),
            ));
        }
        Ok(buf)
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

    fn file(&self, id: SegmentId) -> Option<Arc<dyn VFile>> {
        self.files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Makes every value extent appended so far durable (the WAL calls this before it
    /// syncs records that may name them). Callers are serialised by the WAL.
    pub(crate) fn sync_values(&self) -> Result<()> {
        self.sync_set(|app| &mut app.values_unsynced)
    }

    /// Makes every append so far durable.
    pub(crate) fn sync(&self) -> Result<()> {
        self.sync_set(|app| &mut app.unsynced)
    }

    /// Fsyncs the segments in one of the appender's pending sets, emptying it; on an
    /// error the set is restored, so the next attempt syncs them again.
    fn sync_set(&self, set: fn(&mut Appender) -> &mut BTreeSet<SegmentId>) -> Result<()> {
        let pending = std::mem::take(set(&mut lock(&self.appender)));
        for id in &pending {
            if let Some(f) = self.file(*id) {
                if let Err(e) = f.sync() {
                    set(&mut lock(&self.appender)).extend(pending.iter().copied());
                    return Err(e.into());
                }
            }
        }
        Ok(())
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
            f.sync()?;
        }
        Ok(())
    }

    /// Ends the active segment: later appends go to a new one. The cleaner does this
    /// before it moves the live blocks out of the segment that was taking appends.
    pub(crate) fn seal(&self) -> Result<()> {
        assert!(!self.read_only, "seal on a read-only store");
        let mut app = lock(&self.appender);
        self.roll(&mut app)
    }

    /// The segment taking appends now, if any.
    pub(crate) fn active(&self) -> Option<SegmentId> {
        lock(&self.appender).active.as_ref().map(|(id, _)| *id)
    }

    /// The segment appends go to now or will go to next: the active one, else the
    /// newest file (appends continue it), else the next id to be created.
    pub(crate) fn newest(&self) -> SegmentId {
        let app = lock(&self.appender);
        if let Some((id, _)) = &app.active {
            return *id;
        }
        let files = self
            .files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        files
            .keys()
            .next_back()
            .copied()
            .unwrap_or(SegmentId(app.next_id))
    }

    /// The files named like segments that are not segments of this store, with what
    /// is wrong with each: ignored (see the module docs).
    pub(crate) fn strays(&self) -> &BTreeMap<SegmentId, String> {
        &self.strays
    }

    /// Ids and sizes of every segment file.
    pub(crate) fn sizes(&self) -> Result<Vec<(SegmentId, u64)>> {
        let files: Vec<_> = self
            .files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(id, f)| (*id, f.clone()))
            .collect();
        files
            .into_iter()
            .map(|(id, f)| Ok((id, f.len()?)))
            .collect()
    }

    /// Deletes an empty segment. The caller guarantees nothing reachable lives in it.
    pub(crate) fn delete(&self, id: SegmentId) -> Result<()> {
        assert_ne!(self.active(), Some(id), "deleting the active segment");
        self.files
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        {
            let mut app = lock(&self.appender);
            app.unsynced.remove(&id);
            app.values_unsynced.remove(&id);
        }
        self.vfs.remove(&id.file_name())?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;
