//! The editable form of a leaf: its entries in their on-disk encoding, in one buffer,
//! reached through an array of offsets in key order (a slotted page, as in LMDB).
//!
//! A writer's leaf is three allocations whatever its entry count. Shadowing a written
//! leaf copies its entry bytes once ([`LeafBuf::from_encoded`]); an insert appends the
//! entry to the heap and shifts offsets, never entry bytes; a delete drops an offset;
//! a checkpoint writes the node by copying its entries out in key order. A search scans
//! `heads`, each key's first 8 bytes as an integer, contiguous (a leaf a writer reaches
//! is usually cold: probing the heap itself would miss the CPU's caches once per
//! probe), and compares key bytes only on a tie. Bytes
//! of removed or replaced entries stay in the heap, dead, until they outweigh the live
//! ones and the heap is compacted, or until the leaf is copied (copies take only live
//! entries).
//!
//! Invariants (every constructor and edit keeps them, so accessors index without
//! checks that could fail):
//! - every offset in `offs` starts a complete entry inside `heap`, encoded by
//!   [`encode_entry`]: key length u16, value tag u8, key, then the inline value's
//!   length u32 and bytes, or the extent's `BlockRef`;
//! - keys are strictly increasing in `offs` order, and `heads[i]` is `head_of` the key
//!   at `offs[i]`;
//! - `live` is the sum of the encoded sizes of the entries `offs` reaches;
//! - `extents` is the number of those entries whose value is an extent (a checkpoint
//!   lists a written leaf's extents as back references; most leaves have none, and
//!   the count lets it skip them without reading every entry).

use super::layout::{
    cmp_bytes, head_of, read_block_ref, search_run, ValueRef, LEAF_KEY_AT, VALUE_EXTENT,
    VALUE_INLINE,
};
use crate::format::{len_u16, len_u32, put_u16, put_u32, put_u8, BlockRef};

/// Most heads a search counts one by one rather than halving (see `search`).
const LINEAR_MAX: usize = 64;

/// Bytes of spare heap a leaf gets when it is unpacked for editing.
const HEADROOM: usize = 512;

/// A leaf's entries in editable form. See the module docs for the invariants.
#[derive(Debug, Default)]
pub(crate) struct LeafBuf {
    heap: Vec<u8>,
    offs: Vec<u32>,
    heads: Vec<u64>,
    live: usize,
    extents: usize,
}

/// Capacity for the offsets or heads of `n` entries in a leaf a writer holds: a few
/// more than `n`, so that the first inserts do not reallocate them.
fn slots_for(n: usize) -> usize {
    n + (n / 8).max(8)
}

/// A copy of `v` with room for a few entries more (`slots_for`).
fn with_room<T: Copy>(v: &[T]) -> Vec<T> {
    let mut copy = Vec::with_capacity(slots_for(v.len()));
    copy.extend_from_slice(v);
    copy
}

/// Bytes an entry of `key_len` and `value` takes, encoded.
pub(crate) fn entry_size(key_len: usize, value: ValueRef<'_>) -> usize {
    LEAF_KEY_AT
        + key_len
        + match value {
            ValueRef::Inline(v) => 4 + v.len(),
            ValueRef::Extent(_) => BlockRef::SIZE,
        }
}

/// Appends one leaf entry in its on-disk encoding (docs/FORMAT.md).
pub(crate) fn encode_entry(out: &mut Vec<u8>, key: &[u8], value: ValueRef<'_>) {
    put_u16(out, len_u16(key.len()));
    match value {
        ValueRef::Inline(v) => {
            put_u8(out, VALUE_INLINE);
            out.extend_from_slice(key);
            put_u32(out, len_u32(v.len()));
            out.extend_from_slice(v);
        }
        ValueRef::Extent(r) => {
            put_u8(out, VALUE_EXTENT);
            out.extend_from_slice(key);
            r.encode(out);
        }
    }
}

/// Whether the entry starting at `at` in `heap` (a complete one) holds an extent.
fn is_extent_at(heap: &[u8], at: usize) -> bool {
    heap[at + 2] == VALUE_EXTENT
}

/// The key of the entry starting at `at` in `heap` (which must hold a complete one).
fn key_at(heap: &[u8], at: usize) -> &[u8] {
    let key_len = usize::from(u16::from_le_bytes([heap[at], heap[at + 1]]));
    &heap[at + LEAF_KEY_AT..at + LEAF_KEY_AT + key_len]
}

/// The parts of the entry starting at `at` in `heap` (which must hold a complete one):
/// its key, and its value.
fn entry_at(heap: &[u8], at: usize) -> (&[u8], ValueRef<'_>) {
    let key = key_at(heap, at);
    let tag = heap[at + 2];
    let value_at = at + LEAF_KEY_AT + key.len();
    if tag == VALUE_EXTENT {
        return (key, ValueRef::Extent(read_block_ref(heap, value_at)));
    }
    let len = u32::from_le_bytes(
        heap[value_at..value_at + 4]
            .try_into()
            .expect("a slice of 4 bytes"),
    );
    (
        key,
        ValueRef::Inline(&heap[value_at + 4..value_at + 4 + len as usize]),
    )
}

impl LeafBuf {
    /// A leaf of the given entries, which must be in strictly increasing key order.
    pub(crate) fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a [u8], ValueRef<'a>)>,
    ) -> LeafBuf {
        let mut leaf = LeafBuf::default();
        for (key, value) in entries {
            debug_assert!(
                leaf.last_key().is_none_or(|last| last < key),
                "entries in key order"
            );
            leaf.push(key, value);
        }
        leaf
    }

    /// A leaf of the entries whose encodings lie back to back in `bytes`, starting
    /// at the given offsets (a packed node's entry area: its parse checked
    /// that every entry is complete and that the keys are strictly increasing).
    pub(crate) fn from_encoded(
        bytes: &[u8],
        starts: impl ExactSizeIterator<Item = usize>,
    ) -> LeafBuf {
        // Room for a few entries more in every array (see `heap` below): growing the
        // offsets and heads by one at the first insert would reallocate both, and a
        // writer's allocations are most of its cost once the heap is fragmented.
        let room = slots_for(starts.len());
        let mut offs = Vec::with_capacity(room);
        offs.extend(starts.map(len_u32));
        // One pass over the entries for their heads and their value tags (the tag
        // sits in the same cache line as the key's start).
        let mut extents = 0;
        let mut heads = Vec::with_capacity(room);
        heads.extend(offs.iter().map(|&o| {
            extents += usize::from(is_extent_at(bytes, o as usize));
            head_of(key_at(bytes, o as usize))
        }));
        // Room for a few entries more: a shadowed leaf is shadowed to be edited, and
        // growing a full-size heap would copy all of it again.
        let mut heap = Vec::with_capacity(bytes.len() + HEADROOM.max(bytes.len() / 8));
        heap.extend_from_slice(bytes);
        let leaf = LeafBuf {
            heap,
            live: bytes.len(),
            offs,
            heads,
            extents,
        };
        debug_assert_eq!(
            leaf.offs
                .iter()
                .map(|&o| leaf.encoded_len(o as usize))
                .sum::<usize>(),
            leaf.live,
            "the entries fill the bytes"
        );
        leaf
    }

    pub(crate) fn len(&self) -> usize {
        self.offs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    /// Whether any entry's value is an extent.
    pub(crate) fn has_extents(&self) -> bool {
        self.extents > 0
    }

    /// Encoded size of the entries (the node's size without its header).
    pub(crate) fn encoded_size(&self) -> usize {
        self.live
    }

    /// Memory held by the three buffers.
    pub(crate) fn mem_size(&self) -> usize {
        self.heap.capacity()
            + self.offs.capacity() * size_of::<u32>()
            + self.heads.capacity() * size_of::<u64>()
    }

    fn entry(&self, i: usize) -> (&[u8], ValueRef<'_>) {
        entry_at(&self.heap, self.offs[i] as usize)
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        key_at(&self.heap, self.offs[i] as usize)
    }

    pub(crate) fn value(&self, i: usize) -> ValueRef<'_> {
        self.entry(i).1
    }

    fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    /// Encoded size of the entry at heap offset `at`.
    fn encoded_len(&self, at: usize) -> usize {
        let (key, value) = entry_at(&self.heap, at);
        entry_size(key.len(), value)
    }

    /// Binary search for `key`: `Ok(i)` if entry `i` holds it, else `Err(i)` with `i`
    /// where it would go.
    pub(crate) fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let head = head_of(key);
        // Keys in order (a bulk load, a volume written front to back) go past the last
        // entry: one comparison instead of a scan of every head.
        if let Some(last) = self.heads.len().checked_sub(1) {
            let h = self.heads[last];
            if head > h || (head == h && cmp_bytes(self.key(last), key).is_lt()) {
                return Err(self.heads.len());
            }
        }
        // Heads are non-decreasing (keys are sorted): the entries below the probe are
        // those of a smaller head, then those of an equal head whose bytes are below.
        // A leaf of a few dozen entries (a key-value leaf; most leaves a checkpoint
        // caches in this form) counts them: a branch-free pass over a few cache
        // lines the CPU fetches together, where halving waits for one miss per step.
        // By halves when there are hundreds (a volume's leaf: ~300).
        let lo = match self.heads.len() {
            0..=LINEAR_MAX => self.heads.iter().filter(|&&h| h < head).count(),
            _ => self.heads.partition_point(|&h| h < head),
        };
        // Keys that tie on their head can be many (a volume's 9-byte keys share the
        // first 8 bytes in runs of 256 blocks, most of a leaf): search them by halves.
        let hi = lo + self.heads[lo..].iter().take_while(|&&h| h == head).count();
        search_run(lo, hi, |i| cmp_bytes(self.key(i), key))
    }

    /// Appends an entry to the heap, returning its offset.
    fn append(&mut self, key: &[u8], value: ValueRef<'_>) -> u32 {
        let at = len_u32(self.heap.len());
        encode_entry(&mut self.heap, key, value);
        self.live += entry_size(key.len(), value);
        self.extents += usize::from(value.extent().is_some());
        at
    }

    /// Adds an entry after all others (its key must be greater than theirs).
    fn push(&mut self, key: &[u8], value: ValueRef<'_>) {
        let at = self.append(key, value);
        self.offs.push(at);
        self.heads.push(head_of(key));
    }

    /// Inserts a new entry at index `i` (from `search`'s `Err(i)`).
    pub(crate) fn insert(&mut self, i: usize, key: &[u8], value: ValueRef<'_>) {
        debug_assert!(i == 0 || self.key(i - 1) < key);
        debug_assert!(i == self.len() || key < self.key(i));
        let at = self.append(key, value);
        self.offs.insert(i, at);
        self.heads.insert(i, head_of(key));
    }

    /// Replaces entry `i`'s value. A value of the same encoded size is overwritten in
    /// place; another is appended with a copy of the key, leaving the old entry dead.
    pub(crate) fn set_value(&mut self, i: usize, value: ValueRef<'_>) {
        let at = self.offs[i] as usize;
        let (key, old) = entry_at(&self.heap, at);
        let key_len = key.len();
        let old_size = entry_size(key_len, old);
        self.extents -= usize::from(old.extent().is_some());
        if old_size == entry_size(key_len, value) {
            self.extents += usize::from(value.extent().is_some());
            let mut entry = Vec::with_capacity(old_size);
            encode_entry(&mut entry, key, value);
            self.heap[at..at + old_size].copy_from_slice(&entry);
            return;
        }
        let key = key.to_vec();
        self.offs[i] = self.append(&key, value);
        self.live -= old_size;
        self.compact_if_sparse();
    }

    /// Removes entry `i`.
    pub(crate) fn remove(&mut self, i: usize) {
        let at = self.offs.remove(i) as usize;
        self.heads.remove(i);
        self.live -= self.encoded_len(at);
        self.extents -= usize::from(is_extent_at(&self.heap, at));
        self.compact_if_sparse();
    }

    /// Splits the leaf: this one keeps entries `..at`, the returned one holds `at..`.
    pub(crate) fn split_off(&mut self, at: usize) -> LeafBuf {
        let right = self.copy_range(at, self.len());
        *self = self.copy_range(0, at);
        right
    }

    /// Moves all of `other`'s entries to the end of this leaf (their keys must all be
    /// greater than this leaf's).
    pub(crate) fn append_all(&mut self, other: &mut LeafBuf) {
        debug_assert!(match (self.last_key(), other.len()) {
            (Some(last), 1..) => last < other.key(0),
            _ => true,
        });
        self.heap.reserve(other.live);
        self.offs.reserve(other.len());
        self.heads.reserve(other.len());
        for i in 0..other.len() {
            let (key, value) = other.entry(i);
            self.push(key, value);
        }
        *other = LeafBuf::default();
    }

    /// A compact copy of entries `from..to`: live bytes only.
    fn copy_range(&self, from: usize, to: usize) -> LeafBuf {
        let bytes = (from..to)
            .map(|i| self.encoded_len(self.offs[i] as usize))
            .sum();
        let mut copy = LeafBuf {
            heap: Vec::with_capacity(bytes),
            offs: Vec::with_capacity(slots_for(to - from)),
            heads: with_room(&self.heads[from..to]),
            live: 0,
            extents: 0,
        };
        for i in from..to {
            let at = self.offs[i] as usize;
            let len = self.encoded_len(at);
            copy.extents += usize::from(is_extent_at(&self.heap, at));
            copy.offs.push(len_u32(copy.heap.len()));
            copy.heap.extend_from_slice(&self.heap[at..at + len]);
            copy.live += len;
        }
        copy
    }

    /// Compacts the heap once dead bytes outweigh live ones (so a leaf never holds
    /// more than about twice its encoded size).
    fn compact_if_sparse(&mut self) {
        if self.heap.len() > 2 * self.live + 256 {
            *self = self.copy_range(0, self.len());
        }
    }

    /// Appends the entries' encodings in key order: the node's body as written.
    pub(crate) fn encode_entries(&self, out: &mut Vec<u8>) {
        out.reserve(self.live);
        for &o in &self.offs {
            let at = o as usize;
            out.extend_from_slice(&self.heap[at..at + self.encoded_len(at)]);
        }
    }

    /// The entries, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], ValueRef<'_>)> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }
}

impl Clone for LeafBuf {
    /// A copy of the three arrays as they are (three memcpys: a writer shadows a
    /// leaf it shares with a reader's view at every commit), or a compact copy of the
    /// live entries when dead bytes make up more than a fifth of the heap.
    fn clone(&self) -> LeafBuf {
        if self.heap.len() > self.live + self.live / 4 {
            return self.copy_range(0, self.len());
        }
        let mut heap = Vec::with_capacity(self.heap.len() + HEADROOM);
        heap.extend_from_slice(&self.heap);
        LeafBuf {
            heap,
            offs: with_room(&self.offs),
            heads: with_room(&self.heads),
            live: self.live,
            extents: self.extents,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Random edits against a sorted-map model, with the heap's dead bytes kept in
    //! check and every copy and split compared entry by entry.
    use super::*;
    use crate::format::{Addr, SegmentId};
    use crate::io::sim::SplitMix;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Model {
        Inline(Vec<u8>),
        Extent(BlockRef),
    }

    impl Model {
        fn as_ref(&self) -> ValueRef<'_> {
            match self {
                Model::Inline(v) => ValueRef::Inline(v),
                Model::Extent(r) => ValueRef::Extent(*r),
            }
        }
    }

    fn check(leaf: &LeafBuf, model: &BTreeMap<Vec<u8>, Model>) {
        assert_eq!(leaf.len(), model.len());
        let mut encoded_size = 0;
        for ((key, value), (mk, mv)) in leaf.iter().zip(model) {
            assert_eq!(key, &mk[..]);
            assert_eq!(value, mv.as_ref());
            encoded_size += entry_size(key.len(), value);
        }
        assert_eq!(leaf.encoded_size(), encoded_size);
        let extents = model
            .values()
            .filter(|v| matches!(v, Model::Extent(_)))
            .count();
        assert_eq!(leaf.extents, extents, "the extent count follows every edit");
        assert_eq!(leaf.has_extents(), extents > 0);
        assert_eq!(leaf.heads.len(), leaf.len());
        for i in 0..leaf.len() {
            assert_eq!(leaf.heads[i], head_of(leaf.key(i)));
        }
        let mut out = Vec::new();
        leaf.encode_entries(&mut out);
        assert_eq!(out.len(), encoded_size);
        let mut expected = Vec::new();
        for (k, v) in model {
            encode_entry(&mut expected, k, v.as_ref());
        }
        assert_eq!(out, expected, "the encoding is the entries in order");
        assert!(
            leaf.heap.len() <= 2 * leaf.live + 256 + 4096,
            "dead bytes are reclaimed"
        );
    }

    fn random_value(rng: &mut SplitMix) -> Model {
        if rng.below(5) == 0 {
            Model::Extent(BlockRef {
                addr: Addr::new(
                    SegmentId(u32::try_from(rng.below(9)).expect("small") + 1),
                    rng.below(1 << 20),
                ),
                len: u32::try_from(rng.below(1 << 16)).expect("small"),
                crc: u32::try_from(rng.next_u64() >> 32).expect("32 bits"),
            })
        } else {
            let len = usize::try_from(rng.below(40)).expect("small");
            Model::Inline(vec![u8::try_from(rng.below(256)).expect("a byte"); len])
        }
    }

    #[test]
    fn random_edits_match_a_sorted_map() {
        for seed in 1..40u64 {
            let mut rng = SplitMix(seed);
            let mut leaf = LeafBuf::default();
            let mut model = BTreeMap::new();
            for _ in 0..400 {
                // Short keys, and keys whose first 8 bytes tie (the search's
                // fallback to key bytes), one a prefix of another.
                let key = match rng.below(4) {
                    0 => format!("k{:03}", rng.below(120)).into_bytes(),
                    1 => format!("long-prefix{:02}", rng.below(40)).into_bytes(),
                    2 => format!("long-prefix{}", rng.below(10)).into_bytes(),
                    // A volume's keys: a tag and a big-endian block number; runs of
                    // 256 tie on their first 8 bytes.
                    _ => {
                        let mut k = vec![1u8];
                        k.extend_from_slice(&rng.below(600).to_be_bytes());
                        k
                    }
                };
                match rng.below(10) {
                    0..=5 => {
                        let value = random_value(&mut rng);
                        match leaf.search(&key) {
                            Ok(i) => leaf.set_value(i, value.as_ref()),
                            Err(i) => leaf.insert(i, &key, value.as_ref()),
                        }
                        model.insert(key, value);
                    }
                    6..=8 => {
                        let found = leaf.search(&key);
                        assert_eq!(found.is_ok(), model.contains_key(&key));
                        if let Ok(i) = found {
                            leaf.remove(i);
                            model.remove(&key);
                        }
                    }
                    _ => {
                        // Split, check both halves, and join them again.
                        if leaf.len() >= 2 {
                            let at = usize::try_from(rng.below(leaf.len() as u64)).expect("small");
                            let mut right = leaf.split_off(at);
                            let right_model = model.split_off(
                                &right
                                    .iter()
                                    .next()
                                    .map(|(k, _)| k.to_vec())
                                    .unwrap_or_default(),
                            );
                            check(&leaf, &model);
                            check(&right, &right_model);
                            leaf.append_all(&mut right);
                            assert!(right.is_empty());
                            model.extend(right_model);
                        }
                    }
                }
                check(&leaf, &model);
                check(&leaf.clone(), &model);
            }
        }
    }

    #[test]
    fn from_encoded_reads_what_encode_entries_wrote() {
        let entries: Vec<(Vec<u8>, Model)> = (0..50u32)
            .map(|i| (i.to_be_bytes().to_vec(), Model::Inline(vec![7; i as usize])))
            .collect();
        let leaf = LeafBuf::from_entries(entries.iter().map(|(k, v)| (&k[..], v.as_ref())));
        let mut bytes = Vec::new();
        leaf.encode_entries(&mut bytes);
        let mut starts = Vec::new();
        let mut at = 0;
        for (k, v) in &entries {
            starts.push(at);
            at += entry_size(k.len(), v.as_ref());
        }
        let back = LeafBuf::from_encoded(&bytes, starts.into_iter());
        let model: BTreeMap<_, _> = entries.into_iter().collect();
        check(&back, &model);
    }
}
