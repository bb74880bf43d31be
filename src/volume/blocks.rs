//! Block numbers as keys, and byte ranges cut at block boundaries.

/// The first byte of every block key; the header key starts with 0x00, below it.
const BLOCK_TAG: u8 = 0x01;

/// A block key: the tag, then the block number big-endian, so key order is block
/// order and a range of blocks is a range of keys.
pub(crate) type BlockKey = [u8; 9];

pub(crate) fn block_key(block: u64) -> BlockKey {
    let mut k = [0u8; 9];
    k[0] = BLOCK_TAG;
    k[1..].copy_from_slice(&block.to_be_bytes());
    k
}

/// The block number a key names, or `None` for a key that is not a block's.
pub(crate) fn block_of(key: &[u8]) -> Option<u64> {
    match key {
        [BLOCK_TAG, rest @ ..] => rest.try_into().ok().map(u64::from_be_bytes),
        _ => None,
    }
}

/// One block's share of a byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The block.
    pub block: u64,
    /// Where the piece starts within the block.
    pub within: usize,
    /// Where the piece starts within the caller's buffer.
    pub at: usize,
    /// Its length.
    pub len: usize,
}

impl Piece {
    /// Whether the piece covers its whole block.
    pub(crate) fn is_whole(&self, block_size: usize) -> bool {
        self.len == block_size
    }
}

/// Cuts `len` bytes from `offset` at block boundaries, in order. The caller has
/// checked that `offset + len` does not overflow and that `len` fits in memory.
pub(crate) fn pieces(offset: u64, len: usize, block_size: u32) -> impl Iterator<Item = Piece> {
    let bs = u64::from(block_size);
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let pos = offset + at as u64;
        let within = (pos % bs) as usize;
        let take = (block_size as usize - within).min(len - at);
        let piece = Piece {
            block: pos / bs,
            within,
            at,
            len: take,
        };
        at += take;
        Some(piece)
    })
}

/// Whether every byte is zero: such a block is stored as a hole.
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(16);
    let wide = chunks
        .by_ref()
        .all(|c| u128::from_ne_bytes(c.try_into().expect("16-byte chunk")) == 0);
    wide && chunks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_as_blocks() {
        let mut keys: Vec<BlockKey> = [5u64, 0, u64::MAX, 256, 1].map(block_key).to_vec();
        keys.sort();
        let blocks: Vec<u64> = keys.iter().map(|k| block_of(k).unwrap()).collect();
        assert_eq!(blocks, [0, 1, 5, 256, u64::MAX]);
        assert_eq!(block_of(b"\x00cambium.volume"), None);
        assert_eq!(block_of(&[1, 2, 3]), None);
    }

    #[test]
    fn pieces_cover_the_range_once() {
        for (offset, len) in [
            (0u64, 4096usize),
            (100, 10),
            (4000, 200),
            (4096, 8192),
            (1, 12287),
        ] {
            let ps: Vec<Piece> = pieces(offset, len, 4096).collect();
            assert_eq!(ps.iter().map(|p| p.len).sum::<usize>(), len);
            let mut at = 0;
            for p in &ps {
                assert_eq!(p.at, at);
                assert_eq!(p.block * 4096 + p.within as u64, offset + at as u64);
                assert!(p.within + p.len <= 4096);
                at += p.len;
            }
        }
        assert_eq!(pieces(0, 0, 512).count(), 0);
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0; 4096]));
        assert!(is_zero(&[]));
        for i in [0, 15, 16, 4095] {
            let mut b = vec![0u8; 4096];
            b[i] = 1;
            assert!(!is_zero(&b));
        }
        assert!(!is_zero(&[0, 0, 0, 7]));
    }
}
