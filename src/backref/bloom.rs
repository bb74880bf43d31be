//! A Bloom filter over child addresses, one per run, so that a point query
//! (`parents`) skips the runs that cannot hold its child (Backlog §5.1).
//!
//! `bits` is a power of two of about [`BITS_PER_KEY`] bits per key, probed
//! [`HASHES`] times by double hashing; at 10 bits and 6 probes a key absent from the
//! run is reported present about 0.8% of the time. A key present is always reported
//! present (tested). It is not stored: a run rebuilds it from its records at
//! load.

// Probes computed bits: no indexing.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

/// Filter bits per key.
pub(crate) const BITS_PER_KEY: usize = 10;
/// Probes per key.
pub(crate) const HASHES: u32 = 6;

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
}
