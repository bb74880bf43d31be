//! A Bloom filter over child addresses, one per run, so that a point query
//! (`parents`) skips the runs that cannot hold its child (Backlog §5.1).
//!
//! `bits` is a power of two of about [`BITS_PER_KEY`] bits per key, probed
//! [`HASHES`] times by double hashing; at 10 bits and 6 probes a key absent from the
//! run is reported present about 0.8% of the time. A key present is always reported
//! present (tested).

// Decodes untrusted bytes: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::Result;
use crate::format::{put_u32, put_u64, Decoder};

/// Filter bits per key.
pub(crate) const BITS_PER_KEY: usize = 10;
/// Probes per key.
pub(crate) const HASHES: u32 = 6;
/// The most probes a decoded filter may ask for.
const HASHES_MAX: u32 = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bloom {
    /// The bit array; its length is a power of two.
    words: Vec<u64>,
    hashes: u32,
}

/// Two well-mixed 32-bit hashes of `key` (splitmix64's finalizer).
fn hash_pair(key: u64) -> (u64, u64) {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z & 0xFFFF_FFFF, (z >> 32) | 1)
}

/// The bits `key` sets in a filter of `word_count` words (a power of two).
fn probes(word_count: usize, hashes: u32, key: u64) -> impl Iterator<Item = u64> {
    let mask = (word_count as u64 * 64) - 1;
    let (h1, h2) = hash_pair(key);
    (0..u64::from(hashes)).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & mask)
}

impl Bloom {
    /// A filter sized for `key_count` keys holding `keys`.
    pub(crate) fn build(key_count: usize, keys: impl Iterator<Item = u64>) -> Bloom {
        let bits = (key_count.saturating_mul(BITS_PER_KEY))
            .max(64)
            .next_power_of_two();
        let mut bloom = Bloom {
            words: vec![0; bits / 64],
            hashes: HASHES,
        };
        for key in keys {
            bloom.insert(key);
        }
        bloom
    }

    fn insert(&mut self, key: u64) {
        for bit in probes(self.words.len(), self.hashes, key) {
            let word = usize::try_from(bit / 64).expect("bit index below the array length");
            if let Some(w) = self.words.get_mut(word) {
                *w |= 1 << (bit % 64);
            }
        }
    }

    /// False if `key` is certainly not in the filter.
    pub(crate) fn may_contain(&self, key: u64) -> bool {
        probes(self.words.len(), self.hashes, key).all(|bit| {
            let word = usize::try_from(bit / 64).unwrap_or(usize::MAX);
            self.words
                .get(word)
                .is_some_and(|w| w & (1 << (bit % 64)) != 0)
        })
    }

    /// Encoded size in bytes.
    pub(crate) fn encoded_len(&self) -> usize {
        8 + self.words.len() * 8
    }

    /// `hashes u32, word_count u32, words u64...`
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.hashes);
        put_u32(
            out,
            u32::try_from(self.words.len()).expect("filter sized from a u32-bounded run"),
        );
        for &w in &self.words {
            put_u64(out, w);
        }
    }

    pub(crate) fn decode(d: &mut Decoder<'_>) -> Result<Bloom> {
        let hashes = d.u32()?;
        if hashes == 0 || hashes > HASHES_MAX {
            return Err(d.error(format!("bloom filter with {hashes} hashes")));
        }
        let word_count = d.u32()? as usize;
        if !word_count.is_power_of_two() || word_count.saturating_mul(8) > d.remaining() {
            return Err(d.error(format!("bloom filter of {word_count} words")));
        }
        let words = (0..word_count)
            .map(|_| d.u64())
            .collect::<Result<Vec<u64>>>()?;
        Ok(Bloom { words, hashes })
    }
}
