//! A volume's header: the one key of its tree that is not a block, holding the size
//! and the block size. It lives in the tree, so a snapshot or clone of the volume
//! carries the size it had then, and a resize is an ordinary committed write.
//! Layout in `docs/FORMAT.md` ("Volumes").

use crate::error::{Error, Result};

/// The header's key. It sorts before every block key (which start with 0x01).
pub(crate) const HEADER_KEY: &[u8] = b"\x00cambium.volume";

const MAGIC: &[u8; 4] = b"CVOL";
const FORMAT: u16 = 1;
const ENCODED_LEN: usize = 20;

/// The smallest and largest block sizes (powers of two). Blocks above
/// `INLINE_VALUE_MAX` (1 KiB) are stored as extents of their own; smaller ones sit in
/// the leaves.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// See [`MIN_BLOCK_SIZE`].
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// The default block size: a page of most file systems and guests.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;
/// The largest volume: 2^62 bytes (an NBD export size is signed 64-bit for some
/// clients; this keeps every offset + length sum far from overflow).
pub const MAX_VOLUME_SIZE: u64 = 1 << 62;

/// The flag of a volume an import is still filling: a volume whose import was cut
/// short (the process killed) keeps it, so that it is never taken for the image.
const FLAG_INCOMPLETE: u16 = 1;

/// A volume's geometry, and whether it is whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub size_bytes: u64,
    pub block_size: u32,
    /// An import is filling it (or was, and was cut short).
    pub incomplete: bool,
}

impl Header {
    /// A header for a new volume, checked: a power-of-two block size in range, and a
    /// size that is a positive multiple of it.
    pub(crate) fn new(size_bytes: u64, block_size: u32) -> Result<Header> {
        check_block_size(block_size)?;
        check_size(size_bytes, block_size)?;
        Ok(Header {
            size_bytes,
            block_size,
            incomplete: false,
        })
    }

    /// Blocks in the volume.
    pub(crate) fn blocks(&self) -> u64 {
        self.size_bytes / u64::from(self.block_size)
    }

    pub(crate) fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut b = [0u8; ENCODED_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&FORMAT.to_le_bytes());
        let flags = if self.incomplete { FLAG_INCOMPLETE } else { 0 };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        // b[6..8] reserved, zero.
        b[8..12].copy_from_slice(&self.block_size.to_le_bytes());
        b[12..20].copy_from_slice(&self.size_bytes.to_le_bytes());
        b
    }

    /// Decodes a stored header of volume `name`; anything malformed is corruption
    /// (the tree's checksums held, so a bad header is a bug or a foreign key).
    pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Header> {
        let bad = |why: &str| Error::corrupted("volume header", format!("{name}: {why}"));
        let b: &[u8; ENCODED_LEN] = bytes.try_into().map_err(|_| bad("wrong length"))?;
        let (magic, rest) = b.split_at(4);
        if magic != MAGIC {
            return Err(bad("bad magic"));
        }
        let format = u16::from_le_bytes([rest[0], rest[1]]);
        if format != FORMAT {
            return Err(bad(&format!("unknown format {format}")));
        }
        let flags = u16::from_le_bytes([rest[2], rest[3]]);
        if flags & !FLAG_INCOMPLETE != 0 {
            return Err(bad(&format!("unknown flags {flags:#x}")));
        }
        let block_size = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let mut size = [0u8; 8];
        size.copy_from_slice(&rest[8..16]);
        let size_bytes = u64::from_le_bytes(size);
        let header = Header::new(size_bytes, block_size).map_err(|e| bad(&e.to_string()))?;
        Ok(Header {
            incomplete: flags & FLAG_INCOMPLETE != 0,
            ..header
        })
    }
}

fn check_block_size(block_size: u32) -> Result<()> {
    if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(Error::InvalidArgument(format!(
            "block size {block_size} is not a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}"
        )));
    }
    Ok(())
}

/// A size is a positive multiple of the block size, at most [`MAX_VOLUME_SIZE`].
pub(crate) fn check_size(size_bytes: u64, block_size: u32) -> Result<()> {
    if size_bytes == 0 || size_bytes > MAX_VOLUME_SIZE {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} is not between 1 byte and 4 EiB"
        )));
    }
    if !size_bytes.is_multiple_of(u64::from(block_size)) {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} is not a multiple of the block size {block_size}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let h = Header::new(10 << 30, 4096).unwrap();
        assert_eq!(Header::decode("v", &h.encode()).unwrap(), h);
        let filling = Header {
            incomplete: true,
            ..h
        };
        assert_eq!(Header::decode("v", &filling.encode()).unwrap(), filling);
        assert_eq!(&filling.encode()[6..8], &[1, 0]);
        for i in 0..ENCODED_LEN {
            let mut b = h.encode();
            b[i] ^= 0x40;
            // Every byte matters except the reserved pair and size bits that still
            // give a valid multiple: a flip never yields a panic.
            let _ = Header::decode("v", &b);
        }
        assert!(Header::decode("v", &h.encode()[..19]).is_err());
        let mut b = h.encode();
        b[0] = b'X';
        assert!(Header::decode("v", &b).is_err());
    }

    #[test]
    fn checks_geometry() {
        assert!(Header::new(4096, 4096).is_ok());
        assert!(Header::new(0, 4096).is_err());
        assert!(Header::new(4097, 4096).is_err());
        assert!(Header::new(8192, 3000).is_err());
        assert!(Header::new(1 << 20, 256).is_err());
        assert!(Header::new(MAX_VOLUME_SIZE + 4096, 4096).is_err());
    }
}
