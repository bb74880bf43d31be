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

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::format::{crc, put_u32, put_u64, BlockRef, Decoder, Lsn};
use crate::io::{VFile, Vfs};

pub(crate) const FILE_NAME: &str = "superblock";
pub(crate) const MAGIC: &[u8; 8] = b"CAMBIUM\0";
pub(crate) const SLOT_SIZE: usize = 4096;
const SLOT_USED: usize = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub generation: u64,
    pub checkpoint_lsn: Lsn,
    /// The first WAL generation recovery replays.
    pub wal_gen: u64,
    /// The metadata blob: catalog, usage table, reference counts.
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
        let mut b = Vec::with_capacity(SLOT_SIZE);
        b.extend_from_slice(MAGIC);
        put_u32(&mut b, FORMAT_VERSION);
        put_u32(&mut b, crate::format::len_u32(SLOT_USED));
        put_u64(&mut b, self.generation);
        put_u64(&mut b, self.checkpoint_lsn.0);
        put_u64(&mut b, self.wal_gen);
        self.meta.encode(&mut b);
        put_u32(&mut b, 0);
        put_u32(&mut b, 0);
        put_u64(&mut b, self.created_unix_ms);
        put_u32(&mut b, 0);
        let c = crc(&b);
        put_u32(&mut b, c);
        debug_assert_eq!(b.len(), SLOT_USED);
        b.resize(SLOT_SIZE, 0);
        b
    }

    pub(crate) fn decode(buf: &[u8]) -> Slot {
        match Self::try_decode(buf) {
            Ok(slot) => slot,
            Err(e) => Slot::Invalid(e.to_string()),
        }
    }

    fn try_decode(buf: &[u8]) -> Result<Slot> {
        let mut d = Decoder::new(buf, "superblock");
        if d.bytes(8)? != MAGIC {
            return Ok(Slot::Invalid("bad magic".into()));
        }
        let version = d.u32()?;
        if version != FORMAT_VERSION {
            return Ok(Slot::OtherVersion(version));
        }
        let used = d.u32()? as usize;
        if used != SLOT_USED {
            return Ok(Slot::Invalid(format!("slot length {used}")));
        }
        let stored_crc = u32::from_le_bytes(buf[76..80].try_into().expect("4 bytes"));
        if crc(&buf[..76]) != stored_crc {
            return Ok(Slot::Invalid("checksum mismatch".into()));
        }
        let generation = d.u64()?;
        let checkpoint_lsn = Lsn(d.u64()?);
        let wal_gen = d.u64()?;
        let meta = BlockRef::decode(&mut d)?;
        d.u32()?;
        d.u32()?;
        let created_unix_ms = d.u64()?;
        Ok(Slot::Valid(Superblock {
            generation,
            checkpoint_lsn,
            wal_gen,
            meta,
            created_unix_ms,
        }))
    }
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
        buf[8..12].copy_from_slice(&other.to_le_bytes());
        assert!(matches!(Superblock::decode(&buf), Slot::OtherVersion(v) if v == other));
    }
}
