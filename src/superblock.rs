//! The superblock: the root pointer of the durable state, in two alternating slots.
//!
//! File `superblock` holds two 4 KiB slots. Generation `g` is written to slot `g % 2`,
//! so the slot being overwritten is never the newest durable one; a torn slot write
//! leaves the other intact. Open reads both and takes the newest valid one.
//!
//! Slot layout (little-endian; see docs/FORMAT.md):
//! ```text
//!  0 magic [8] "CAMBIUM\0"    8 format_version u32     12 slot_len u32 (= 80)
//! 16 generation u64          24 checkpoint_lsn u64     32 wal_gen u64
//! 40 meta BlockRef (addr u64, len u32, crc u32)       56 reserved u32 (0)
//! 60 reserved u32 (0)        64 created_unix_ms u64    72 reserved u32 (0)
//! 76 crc u32 over bytes 0..76; the rest of the 4 KiB slot is zero
//! ```
//! Magic and format version are checked before the checksum: a store from another
//! format version may lay out (and checksum) its slot differently, and deserves a
//! "wrong version" error rather than "corrupted".

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::format::{crc, len_u32, BlockRef, Decoder, Lsn};
use crate::io::{VFile, Vfs};

pub(crate) const FILE_NAME: &str = "superblock";
pub(crate) const MAGIC: &[u8; 8] = b"CAMBIUM\0";
pub(crate) const SLOT_SIZE: usize = 4096;
/// The file holds two slots.
pub(crate) const FILE_BYTES: usize = 2 * SLOT_SIZE;

/// How many times [`read_between_checkpoints`] starts over.
const READ_ATTEMPTS: u32 = 100;

/// Runs `read` until no checkpoint (of this process or another) lands while it runs,
/// and returns what that run returned: the superblock's bytes are read before and
/// after, and a checkpoint rewrites one of its slots. Files are deleted or recycled
/// only once a newer superblock is durable, so a `read` that opened what it needs
/// while the bytes stayed the same read one consistent state. Each try is short next
/// to a checkpoint; after [`READ_ATTEMPTS`] it gives up.
pub(crate) fn read_between_checkpoints<T>(
    vfs: &dyn Vfs,
    label: &str,
    mut read: impl FnMut() -> T,
) -> Result<T> {
    for attempt in 1..=READ_ATTEMPTS {
        let before = raw_bytes(vfs)?;
        let value = read();
        if raw_bytes(vfs)? == before {
            return Ok(value);
        }
        drop(value);
        std::thread::sleep(std::time::Duration::from_millis(u64::from(attempt.min(20))));
    }
    Err(Error::Io(std::io::Error::other(format!(
        "{label}: the store changed under each of {READ_ATTEMPTS} attempts to read it \
         (another process checkpoints faster than this reads); try again"
    ))))
}

/// The superblock file's bytes (both slots): a checkpoint rewrites one of them, so
/// equal bytes before and after a read mean no checkpoint landed in between.
fn raw_bytes(vfs: &dyn Vfs) -> Result<Vec<u8>> {
    let file = vfs.open(FILE_NAME)?;
    let len = usize::try_from(file.len()?).unwrap_or(usize::MAX);
    let mut buf = vec![0; len.min(FILE_BYTES)];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

// Slot layout: the byte offset of each field. docs/FORMAT.md has the same table, and
// `crate::format_tests` checks the two against each other.
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_FORMAT_VERSION: usize = 8;
pub(crate) const OFF_SLOT_LEN: usize = 12;
pub(crate) const OFF_GENERATION: usize = 16;
pub(crate) const OFF_CHECKPOINT_LSN: usize = 24;
pub(crate) const OFF_WAL_GEN: usize = 32;
pub(crate) const OFF_META: usize = 40;
pub(crate) const OFF_RESERVED0: usize = 56;
pub(crate) const OFF_RESERVED1: usize = 60;
pub(crate) const OFF_CREATED_UNIX_MS: usize = 64;
pub(crate) const OFF_RESERVED2: usize = 72;
/// The checksum covers every byte before it.
pub(crate) const OFF_CRC: usize = 76;
/// Bytes of the slot in use (the value of the `slot_len` field); the rest is zero.
pub(crate) const SLOT_USED: usize = 80;

// The fields are contiguous, each as wide as its type, and fill exactly `SLOT_USED`.
const _: () = assert!(OFF_MAGIC == 0);
const _: () = assert!(OFF_MAGIC + MAGIC.len() == OFF_FORMAT_VERSION);
const _: () = assert!(OFF_FORMAT_VERSION + size_of::<u32>() == OFF_SLOT_LEN);
const _: () = assert!(OFF_SLOT_LEN + size_of::<u32>() == OFF_GENERATION);
const _: () = assert!(OFF_GENERATION + size_of::<u64>() == OFF_CHECKPOINT_LSN);
const _: () = assert!(OFF_CHECKPOINT_LSN + size_of::<u64>() == OFF_WAL_GEN);
const _: () = assert!(OFF_WAL_GEN + size_of::<u64>() == OFF_META);
const _: () = assert!(OFF_META + BlockRef::SIZE == OFF_RESERVED0);
const _: () = assert!(OFF_RESERVED0 + size_of::<u32>() == OFF_RESERVED1);
const _: () = assert!(OFF_RESERVED1 + size_of::<u32>() == OFF_CREATED_UNIX_MS);
const _: () = assert!(OFF_CREATED_UNIX_MS + size_of::<u64>() == OFF_RESERVED2);
const _: () = assert!(OFF_RESERVED2 + size_of::<u32>() == OFF_CRC);
const _: () = assert!(OFF_CRC + size_of::<u32>() == SLOT_USED);
const _: () = assert!(SLOT_USED <= SLOT_SIZE);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub generation: u64,
    pub checkpoint_lsn: Lsn,
    /// The first WAL generation recovery replays.
    pub wal_gen: u64,
    /// The newest blob of the metadata chain (catalog, usage table, reference counts,
    /// drop queue, pending deletions; see `meta`).
    pub meta: BlockRef,
    pub created_unix_ms: u64,
}

/// What one slot held.
#[derive(Debug)]
pub(crate) enum Slot {
    Valid(Superblock),
    /// Not a valid slot of this format (never written, torn, or corrupted).
    Invalid(String),
    /// A valid-looking slot of another format version.
    OtherVersion(u32),
}

impl Superblock {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SLOT_SIZE];
        put_at(&mut b, OFF_MAGIC, MAGIC);
        put_at(&mut b, OFF_FORMAT_VERSION, &FORMAT_VERSION.to_le_bytes());
        put_at(&mut b, OFF_SLOT_LEN, &len_u32(SLOT_USED).to_le_bytes());
        put_at(&mut b, OFF_GENERATION, &self.generation.to_le_bytes());
        put_at(
            &mut b,
            OFF_CHECKPOINT_LSN,
            &self.checkpoint_lsn.0.to_le_bytes(),
        );
        put_at(&mut b, OFF_WAL_GEN, &self.wal_gen.to_le_bytes());
        let mut meta = Vec::with_capacity(BlockRef::SIZE);
        self.meta.encode(&mut meta);
        put_at(&mut b, OFF_META, &meta);
        // The reserved fields stay zero.
        put_at(
            &mut b,
            OFF_CREATED_UNIX_MS,
            &self.created_unix_ms.to_le_bytes(),
        );
        #[allow(
            clippy::indexing_slicing,
            reason = "b is SLOT_SIZE long, OFF_CRC < SLOT_USED"
        )]
        let c = crc(&b[..OFF_CRC]);
        put_at(&mut b, OFF_CRC, &c.to_le_bytes());
        b
    }

    pub(crate) fn decode(buf: &[u8]) -> Slot {
        match Self::try_decode(buf) {
            Ok(slot) => slot,
            Err(e) => Slot::Invalid(e.to_string()),
        }
    }

    fn try_decode(buf: &[u8]) -> Result<Slot> {
        if buf.get(OFF_MAGIC..OFF_FORMAT_VERSION) != Some(&MAGIC[..]) {
            return Ok(Slot::Invalid("bad magic".into()));
        }
        let version = u32_at(buf, OFF_FORMAT_VERSION)?;
        if version != FORMAT_VERSION {
            return Ok(Slot::OtherVersion(version));
        }
        let used = u32_at(buf, OFF_SLOT_LEN)? as usize;
        if used != SLOT_USED {
            return Ok(Slot::Invalid(format!("slot length {used}")));
        }
        let stored_crc = u32_at(buf, OFF_CRC)?;
        #[allow(
            clippy::indexing_slicing,
            reason = "the crc field was read, so buf is longer"
        )]
        let covered = &buf[..OFF_CRC];
        if crc(covered) != stored_crc {
            return Ok(Slot::Invalid("checksum mismatch".into()));
        }
        let meta_bytes = buf
            .get(OFF_META..OFF_META + BlockRef::SIZE)
            .ok_or_else(|| Error::corrupted("superblock", "slot too short"))?;
        let meta = BlockRef::decode(&mut Decoder::new(meta_bytes, "superblock"))?;
        Ok(Slot::Valid(Superblock {
            generation: u64_at(buf, OFF_GENERATION)?,
            checkpoint_lsn: Lsn(u64_at(buf, OFF_CHECKPOINT_LSN)?),
            wal_gen: u64_at(buf, OFF_WAL_GEN)?,
            meta,
            created_unix_ms: u64_at(buf, OFF_CREATED_UNIX_MS)?,
        }))
    }
}

/// Writes `bytes` into `buf` at `at`.
#[allow(
    clippy::indexing_slicing,
    reason = "an encoder's own fixed-size buffer: the const assertions keep every field inside SLOT_USED"
)]
fn put_at(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The `u32` at `at`, or a corruption error when `buf` is too short.
fn u32_at(buf: &[u8], at: usize) -> Result<u32> {
    Decoder::new(buf.get(at..).unwrap_or_default(), "superblock").u32()
}

/// The `u64` at `at`, or a corruption error when `buf` is too short.
fn u64_at(buf: &[u8], at: usize) -> Result<u64> {
    Decoder::new(buf.get(at..).unwrap_or_default(), "superblock").u64()
}

/// Both slots of a superblock file, and the one to use.
pub(crate) struct SuperblockFile {
    pub file: std::sync::Arc<dyn VFile>,
    pub slots: [Slot; 2],
}

impl SuperblockFile {
    /// Reads both slots. A missing file means the directory is not a store.
    pub(crate) fn read(vfs: &dyn Vfs, label: &str) -> Result<SuperblockFile> {
        if !vfs.exists(FILE_NAME)? {
            return Err(Error::NotAStore(label.to_owned()));
        }
        let file = vfs.open(FILE_NAME)?;
        let len = file.len()?;
        let mut slots = [
            Slot::Invalid("missing".into()),
            Slot::Invalid("missing".into()),
        ];
        for (i, slot) in slots.iter_mut().enumerate() {
            let at = (i * SLOT_SIZE) as u64;
            if len >= at + SLOT_SIZE as u64 {
                let mut buf = vec![0u8; SLOT_SIZE];
                file.read_exact_at(&mut buf, at)?;
                *slot = Superblock::decode(&buf);
            } else {
                *slot = Slot::Invalid("slot past end of file".into());
            }
        }
        Ok(SuperblockFile { file, slots })
    }

    /// The newest valid slot, in recovery order: newest first, then the other.
    pub(crate) fn candidates(&self) -> Result<Vec<Superblock>> {
        let mut valid: Vec<Superblock> = self
            .slots
            .iter()
            .filter_map(|s| {
                if let Slot::Valid(sb) = s {
                    Some(*sb)
                } else {
                    None
                }
            })
            .collect();
        valid.sort_by_key(|sb| std::cmp::Reverse(sb.generation));
        if valid.is_empty() {
            if let Some(found) = self.slots.iter().find_map(|s| {
                if let Slot::OtherVersion(v) = s {
                    Some(*v)
                } else {
                    None
                }
            }) {
                return Err(Error::FormatVersion {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            let why: Vec<String> = self.slots.iter().map(|s| format!("{s:?}")).collect();
            return Err(Error::corrupted(
                "superblock",
                format!("no valid slot ({})", why.join("; ")),
            ));
        }
        Ok(valid)
    }

    /// Whether one slot does not hold a valid superblock.
    pub(crate) fn has_invalid_slot(&self) -> bool {
        self.slots.iter().any(|s| !matches!(s, Slot::Valid(_)))
    }

    /// Writes `sb` into its slot and makes it durable.
    pub(crate) fn write(file: &dyn VFile, sb: &Superblock) -> Result<()> {
        let slot = sb.generation % 2;
        file.write_all_at(&sb.encode(), slot * SLOT_SIZE as u64)?;
        file.sync()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_slot_table_matches_the_code() {
        use crate::format_tests::{check_layout, layout_table, leading_number};
        check_layout(
            "superblock-slot",
            &[
                ("magic", OFF_MAGIC),
                ("format_version", OFF_FORMAT_VERSION),
                ("slot_len", OFF_SLOT_LEN),
                ("generation", OFF_GENERATION),
                ("checkpoint_lsn", OFF_CHECKPOINT_LSN),
                ("wal_gen", OFF_WAL_GEN),
                ("meta", OFF_META),
                ("reserved", OFF_RESERVED0),
                ("reserved", OFF_RESERVED1),
                ("created_unix_ms", OFF_CREATED_UNIX_MS),
                ("reserved", OFF_RESERVED2),
                ("crc", OFF_CRC),
            ],
            SLOT_USED,
        );
        // The documented values of the version and length fields.
        let rows = layout_table("superblock-slot");
        let value = |field: &str| {
            let row = rows
                .iter()
                .find(|r| r.field == field)
                .expect("checked above");
            leading_number(&row.meaning)
                .unwrap_or_else(|| panic!("superblock {field}: no value in {:?}", row.meaning))
        };
        assert_eq!(
            value("format_version"),
            u64::from(crate::format::FORMAT_VERSION)
        );
        assert_eq!(value("slot_len"), SLOT_USED as u64);
    }
    use crate::format::{Addr, SegmentId};

    fn sample() -> Superblock {
        Superblock {
            generation: 9,
            checkpoint_lsn: Lsn(77),
            wal_gen: 4,
            meta: BlockRef {
                addr: Addr::new(SegmentId(2), 100),
                len: 50,
                crc: 7,
            },
            created_unix_ms: 1,
        }
    }

    #[test]
    fn round_trip_and_every_flip_is_caught() {
        let buf = sample().encode();
        assert!(matches!(Superblock::decode(&buf), Slot::Valid(sb) if sb == sample()));
        for i in 0..SLOT_USED {
            let mut b = buf.clone();
            b[i] ^= 1;
            assert!(
                !matches!(Superblock::decode(&b), Slot::Valid(_)),
                "flip at {i} undetected"
            );
        }
    }

    #[test]
    fn other_version_is_reported_as_such() {
        let mut buf = sample().encode();
        let other = FORMAT_VERSION + 1;
        buf[OFF_FORMAT_VERSION..OFF_SLOT_LEN].copy_from_slice(&other.to_le_bytes());
        assert!(matches!(Superblock::decode(&buf), Slot::OtherVersion(v) if v == other));
    }
}
