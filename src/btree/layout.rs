//! The on-disk layout of a node, shared by its two in-memory forms (`node.rs`'s
//! editable one and `packed.rs`'s), and the view of a value both hand to readers.
//! docs/FORMAT.md describes the same layout.

use crate::format::BlockRef;
use crate::limits::{INLINE_VALUE_MAX, MAX_KEY_LEN};

pub(crate) const NODE_MAGIC: u32 = u32::from_le_bytes(*b"CNOD");

// Header layout: the byte offset of each field. docs/FORMAT.md has the same table, and
// `crate::format_tests` checks the two against each other.
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_CRC: usize = 4;
pub(crate) const OFF_KIND: usize = 8;
pub(crate) const OFF_LEVEL: usize = 9;
pub(crate) const OFF_RESERVED: usize = 10;
pub(crate) const OFF_COUNT: usize = 12;
/// Entries follow the header.
pub(crate) const HEADER_SIZE: usize = 16;
/// The node's own checksum covers its bytes from here to the end.
pub(crate) const CRC_FROM: usize = OFF_KIND;

// The fields are contiguous, each as wide as its type, and fill exactly `HEADER_SIZE`.
const _: () = assert!(OFF_MAGIC == 0);
const _: () = assert!(OFF_MAGIC + size_of::<u32>() == OFF_CRC);
const _: () = assert!(OFF_CRC + size_of::<u32>() == OFF_KIND);
const _: () = assert!(OFF_KIND + size_of::<u8>() == OFF_LEVEL);
const _: () = assert!(OFF_LEVEL + size_of::<u8>() == OFF_RESERVED);
const _: () = assert!(OFF_RESERVED + size_of::<u16>() == OFF_COUNT);
const _: () = assert!(OFF_COUNT + size_of::<u32>() == HEADER_SIZE);
const _: () = assert!(CRC_FROM == OFF_CRC + size_of::<u32>());
/// Largest encoded node. 8 KiB holds ~45 entries of the 24 B/150 B benchmark shape and
/// ~190 branch entries of 24-byte keys, giving a 3-level tree for a million keys.
pub(crate) const NODE_MAX: usize = 8192;
/// Nodes below this size are fixed (merged or rebalanced) when a delete passes by.
pub(crate) const NODE_MIN: usize = NODE_MAX / 4;
/// A merge is done only when the result stays this small, so a merged node is not
/// split again by the next insert (the split/merge ping-pong Rodeh's [b, 3b] avoids).
pub(crate) const MERGE_MAX: usize = NODE_MAX * 3 / 4;
/// The largest branch entry: what a split may push into a parent.
pub(crate) const BRANCH_ENTRY_MAX: usize = 2 + MAX_KEY_LEN + BlockRef::SIZE;
/// The largest leaf entry: a maximal key with a value just at the inline limit.
pub(crate) const LEAF_ENTRY_MAX: usize = 2 + 1 + MAX_KEY_LEN + 4 + INLINE_VALUE_MAX;
/// Deepest tree we accept from disk; a bound on descent against corrupted pointers.
pub(crate) const MAX_DEPTH: usize = 32;

/// Where a leaf entry's key starts in the entry: after its key length (u16) and its
/// value tag (u8).
pub(crate) const LEAF_KEY_AT: usize = 3;

pub(crate) const KIND_LEAF: u8 = 1;
pub(crate) const KIND_BRANCH: u8 = 2;
pub(crate) const VALUE_INLINE: u8 = 0;
pub(crate) const VALUE_EXTENT: u8 = 1;

/// A value as a reader sees it, in either form of node: inline bytes borrowed from the
/// node, or the extent holding them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueRef<'a> {
    Inline(&'a [u8]),
    Extent(BlockRef),
}

impl ValueRef<'_> {
    pub(crate) fn extent(self) -> Option<BlockRef> {
        match self {
            ValueRef::Extent(r) => Some(r),
            ValueRef::Inline(_) => None,
        }
    }
}

/// The block reference encoded at `at` in `bytes` (`BlockRef::encode`'s field order),
/// for bytes whose structure was checked already: panics if they end too soon.
pub(crate) fn read_block_ref(bytes: &[u8], at: usize) -> BlockRef {
    let field = |from: usize, n: usize| &bytes[at + from..at + from + n];
    BlockRef {
        addr: crate::format::Addr(u64::from_le_bytes(field(0, 8).try_into().expect("8 bytes"))),
        len: u32::from_le_bytes(field(8, 4).try_into().expect("4 bytes")),
        crc: u32::from_le_bytes(field(12, 4).try_into().expect("4 bytes")),
    }
}

/// The first 8 bytes of `bytes`, zero-padded, as a big-endian integer. Zero padding
/// keeps integer order consistent with byte order: if two heads differ, so do the
/// byte strings, in the same direction (a shorter one padded with zeros compares at
/// most equal to a longer one it is a prefix of; ties are resolved on the bytes).
#[inline]
pub(crate) fn head_of(bytes: &[u8]) -> u64 {
    // Eight bytes or more: one load. A copy of a length the compiler cannot see is a
    // call to libc's `memmove`, which was a sixth of a range read's time (`perf`, 1M
    // keys: every search and key comparison takes heads).
    if let Some(first) = bytes.first_chunk::<8>() {
        return u64::from_be_bytes(*first);
    }
    // Shorter (a key's tail in `cmp_bytes`): byte by byte into place, which the
    // compiler keeps in registers (a copy into a zeroed array became `memmove` again).
    bytes
        .iter()
        .enumerate()
        .fold(0, |head, (i, &b)| head | u64::from(b) << (56 - 8 * i))
}

/// Orders two byte strings as `<[u8] as Ord>::cmp` does, eight bytes at a time in
/// registers. Keys are short (a volume's are 9 bytes, the benchmark's 24), and a call
/// into libc's `memcmp` for each took a fifth of a range read's time (`perf`, 1M keys).
#[inline]
pub(crate) fn cmp_bytes(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        // Zero-padded past `n`: both sides pad the same bytes, so a difference is a
        // real one, and equal words leave the lengths to decide.
        let (x, y) = (head_of(&a[i..n]), head_of(&b[i..n]));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    a.len().cmp(&b.len())
}

/// Binary search of the sorted entries `lo..hi` with `cmp(i)`, entry `i`'s key
/// against the probe: `Ok(i)` where it is equal, else `Err(i)` where the probe would go.
#[inline]
pub(crate) fn search_run(
    mut lo: usize,
    mut hi: usize,
    cmp: impl Fn(usize) -> std::cmp::Ordering,
) -> Result<usize, usize> {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match cmp(mid) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Equal => return Ok(mid),
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    Err(lo)
}

/// Asks the CPU to start fetching the cache line holding `at` (a hint: nothing is
/// read, nothing can fault). A range scan calls it for the entries a few places ahead
/// of the one it yields, so that their first touches, each a memory miss on a tree
/// larger than the CPU's caches, overlap instead of following one another; a
/// writer's branch search for both entries its next step may read.
#[inline]
pub(crate) fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code, reason = "a cache hint: see SAFETY")]
    // SAFETY: `_mm_prefetch` is only a hint to the cache: it never faults and reads
    // nothing the program can observe, whatever the address; SSE is part of x86_64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(at).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmp_bytes_orders_as_slices_do() {
        let words: [&[u8]; 12] = [
            b"",
            b"\0",
            b"\0\0",
            b"a",
            b"ab",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefghi",
            b"abcdefgi",
            b"abcdefghijklmnopq",
            b"abcdefghijklmnopr",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ];
        for a in words {
            for b in words {
                assert_eq!(cmp_bytes(a, b), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
        let mut rng = crate::io::sim::SplitMix(7);
        for _ in 0..20_000 {
            let mut gen = || {
                let len = rng.below(20) as usize;
                (0..len).map(|_| rng.below(3) as u8).collect::<Vec<u8>>()
            };
            let (a, b) = (gen(), gen());
            assert_eq!(
                cmp_bytes(&a, &b),
                a.as_slice().cmp(b.as_slice()),
                "{a:?} vs {b:?}"
            );
        }
    }

    #[test]
    fn head_of_is_the_first_eight_bytes_zero_padded() {
        let mut rng = crate::io::sim::SplitMix(11);
        for _ in 0..2_000 {
            let len = rng.below(20) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            let mut padded = [0u8; 8];
            let n = len.min(8);
            padded[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(head_of(&bytes), u64::from_be_bytes(padded), "{bytes:?}");
        }
    }

    #[test]
    fn node_header_table_matches_the_code() {
        crate::format_tests::check_layout(
            "node-header",
            &[
                ("magic", OFF_MAGIC),
                ("crc", OFF_CRC),
                ("kind", OFF_KIND),
                ("level", OFF_LEVEL),
                ("reserved", OFF_RESERVED),
                ("count", OFF_COUNT),
            ],
            HEADER_SIZE,
        );
    }
}
