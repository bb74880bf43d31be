//! The codec vocabulary shared by every on-disk structure: little-endian fixed-width
//! integers, checksums (CRC-32C), the address newtypes and a bounds-checked decoder
//! that turns short or malformed input into `Error::Corrupted`, never a panic.

// A decoder of untrusted bytes: every index is justified where it is.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// The on-disk format version this build reads and writes (see docs/FORMAT.md's
/// change log).
pub const FORMAT_VERSION: u32 = 4;

/// CRC-32C (Castagnoli) of `data`.
pub(crate) fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// CRC-32C of `data`, continuing from `seed`.
pub(crate) fn crc_append(seed: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(seed, data)
}

/// A segment file's number. Segment ids are never reused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct SegmentId(pub u32);

impl SegmentId {
    /// The file name of this segment inside the store directory.
    pub(crate) fn file_name(self) -> String {
        format!("seg-{:08x}.dat", self.0)
    }

    /// Parses a segment file name back into its id.
    pub(crate) fn parse_file_name(name: &str) -> Option<SegmentId> {
        let hex = name.strip_prefix("seg-")?.strip_suffix(".dat")?;
        if hex.len() != 8 {
            return None;
        }
        u32::from_str_radix(hex, 16).ok().map(SegmentId)
    }
}

/// Bits of an [`Addr`] holding the byte offset inside a segment (1 TiB).
const OFFSET_BITS: u32 = 40;

/// A physical address: segment id in the top 24 bits, byte offset in the low 40.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Addr(pub u64);

impl Addr {
    pub(crate) fn new(segment: SegmentId, offset: u64) -> Addr {
        assert!(
            offset < 1 << OFFSET_BITS,
            "segment offset {offset} out of range"
        );
        assert!(
            segment.0 < 1 << (64 - OFFSET_BITS),
            "segment id out of range"
        );
        Addr((u64::from(segment.0) << OFFSET_BITS) | offset)
    }
    /// The address just past every byte of `segment` (the next segment's first; for
    /// the last id an address can hold, `Addr(u64::MAX)`, which is no block's).
    pub(crate) fn end_of(segment: SegmentId) -> Addr {
        match segment.0.checked_add(1) {
            Some(next) if u64::from(next) < 1 << (64 - OFFSET_BITS) => {
                Addr::new(SegmentId(next), 0)
            }
            _ => Addr(u64::MAX),
        }
    }
    pub(crate) fn segment(self) -> SegmentId {
        SegmentId(u32::try_from(self.0 >> OFFSET_BITS).expect("24 bits remain after the shift"))
    }
    pub(crate) fn offset(self) -> u64 {
        self.0 & ((1 << OFFSET_BITS) - 1)
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.segment().0, self.offset())
    }
}

/// A log sequence number: commits are numbered 1, 2, 3, ... in commit order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub(crate) struct Lsn(pub u64);

impl Lsn {
    pub(crate) fn next(self) -> Lsn {
        Lsn(self.0 + 1)
    }
}

/// A reference from a parent to a block it owns: where it is, how long it is and the
/// CRC-32C of its bytes. Keeping the checksum in the parent catches misdirected and
/// lost writes that a self-checksum cannot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct BlockRef {
    pub addr: Addr,
    pub len: u32,
    pub crc: u32,
}

impl BlockRef {
    /// Encoded size: addr u64, len u32, crc u32.
    pub(crate) const SIZE: usize = 16;

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.addr.0);
        put_u32(out, self.len);
        put_u32(out, self.crc);
    }

    pub(crate) fn decode(d: &mut Decoder<'_>) -> Result<BlockRef> {
        Ok(BlockRef {
            addr: Addr(d.u64()?),
            len: d.u32()?,
            crc: d.u32()?,
        })
    }
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Converts a length that the caller has already bounded to a `u32` field.
pub(crate) fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("length bounded by the caller")
}

/// Converts a key length (at most `MAX_KEY_LEN`) to its `u16` field.
pub(crate) fn len_u16(len: usize) -> u16 {
    u16::try_from(len).expect("key length bounded by MAX_KEY_LEN")
}

/// A bounds-checked little-endian reader over untrusted bytes.
pub(crate) struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Decoder { buf, pos: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::corrupted(
                self.what,
                format!(
                    "truncated: need {n} bytes at offset {}, have {}",
                    self.pos,
                    self.remaining()
                ),
            ));
        }
        #[allow(clippy::indexing_slicing, reason = "n <= remaining(), checked above")]
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A corruption error about this structure.
    pub(crate) fn error(&self, detail: impl Into<String>) -> Error {
        Error::corrupted(self.what, detail)
    }
}

/// A hasher for addresses (and other integers): a few multiplies and shifts instead of
/// SipHash, which costs several times as much on the read path.
///
/// The mixing must carry every input bit to the *low* bits of the hash, which are
/// what the table's bucket index is made of. Addresses are not well spread there: a
/// value extent sits at a 4 KiB-aligned offset, so its low 12 bits are zero, and a
/// single multiply (which the hasher used to be) leaves low bits depending only on
/// low bits. Every extent then fell into one bucket in 4,096 and each insert probed
/// a chain of thousands: after a snapshot of a busy volume, applying the reference
/// counts of the leaves its writes shadowed held the writer lock for 4–7 ms per
/// commit (57% of the server's CPU under 4 KiB random writes).
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

/// A hash map keyed by addresses (or other integers).
pub(crate) type AddrMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

/// A hash set of addresses (or other integers).
pub(crate) type AddrSet<K> = HashSet<K, BuildHasherDefault<AddrHasher>>;

/// SplitMix64's finalizer: a bijection whose every output bit depends on every
/// input bit.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            for (w, b) in word.iter_mut().zip(chunk) {
                *w = *b;
            }
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Folds into what came before, so a key of several integers hashes all of them.
        self.0 = mix(self.0 ^ n);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Milliseconds since the Unix epoch, for creation times shown to people.
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_round_trip() {
        let a = Addr::new(SegmentId(7), 123_456);
        assert_eq!(a.segment(), SegmentId(7));
        assert_eq!(a.offset(), 123_456);
    }

    /// A table indexes its buckets by the hash's low bits: 4 KiB-aligned addresses
    /// (every value extent's) must spread over them as random keys would, and a
    /// key of several integers must depend on each.
    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<AddrHasher>::default();
        let buckets = 4096u64;
        let low: std::collections::BTreeSet<u64> = (0..buckets)
            .map(|i| build.hash_one(Addr::new(SegmentId(3), 4096 * (i + 8))) % buckets)
            .collect();
        // Random keys fill 1 - 1/e of the buckets (~2,589); the old single multiply filled 1.
        assert!(low.len() > 2400, "{} of {buckets} buckets used", low.len());
        assert_ne!(build.hash_one((1u64, 2u64)), build.hash_one((3u64, 2u64)));
    }

    #[test]
    fn segment_names_round_trip() {
        let id = SegmentId(0x1f);
        assert_eq!(SegmentId::parse_file_name(&id.file_name()), Some(id));
        assert_eq!(SegmentId::parse_file_name("seg-zz.dat"), None);
    }

    #[test]
    fn decoder_reports_truncation() {
        let mut d = Decoder::new(&[1, 2], "test");
        assert!(d.u32().unwrap_err().is_corruption());
    }
}
