//! The packed form of a written node: the node's own on-disk bytes, kept as read, and
//! one fixed-size slot per entry, built in a single validating pass.
//!
//! This is the form the page cache holds and readers search. A search scans the
//! `heads` array (4 key bytes per entry as an integer, contiguous: 180 bytes for a leaf
//! of 45 entries) counting the heads below the probe's, then compares key bytes only
//! for entries whose head ties. The scan's loads do not depend on one another, so a
//! node just fetched from memory costs about one memory latency, where a binary search
//! costs one per probe; it also compiles to vector compares. Nothing is allocated and
//! nothing is copied but the value a caller asks for. A writer that needs to change the
//! node unpacks it once, into the editable form (`Body::Leaf` / `Body::Branch`), when
//! it shadows it.
//!
//! Prefix compression in memory: the bytes every key of the node begins with (the
//! longest common prefix of its first and last keys, since keys are sorted) are compared
//! once per search, not once per probe, and `head` is taken from the bytes after them.
//! Keys that share a long prefix ("user:000…") would otherwise tie on every probe's
//! integer and fall back to a byte comparison each time.
//!
//! Invariants, established by [`Packed::parse`] and relied on by every accessor (so
//! the accessors index without checks that could fail):
//! - `bytes` passed the node's self-checksum and parses completely: every slot's key
//!   and value (or child reference) lies inside `bytes`;
//! - keys are 1..=`MAX_KEY_LEN` bytes and strictly increasing, so every key is at
//!   least `prefix_len` long and starts with the same `prefix_len` bytes;
//! - a leaf's tags are `VALUE_INLINE` or `VALUE_EXTENT`; a branch has an entry.

use super::layout::{
    cmp_bytes, head_of, prefetch, read_block_ref, search_run, ValueRef, CRC_FROM, HEADER_SIZE,
    KIND_BRANCH, KIND_LEAF, LEAF_KEY_AT, MAX_DEPTH, NODE_MAGIC, VALUE_EXTENT, VALUE_INLINE,
};
use super::leaf::LeafBuf;
use crate::error::Result;
use crate::format::{crc, Addr, BlockRef, Decoder};
use crate::limits::MAX_KEY_LEN;
use std::cmp::Ordering;

/// A written node in its packed form. See the module docs for the invariants.
pub(crate) struct Packed {
    bytes: Box<[u8]>,
    /// Per entry, the 4 key bytes after the shared prefix, zero-padded, as a
    /// big-endian integer ([`head32`]). Non-decreasing, since keys are sorted: if two heads differ,
    /// so do the keys, in the same direction.
    ///
    /// Then, per entry, its [`Slot`] as two words (key offset; key length and tag).
    /// One allocation for both: a search reads the heads and then a slot or two,
    /// and the lines after the heads are the ones the CPU fetches next.
    index: Box<[u32]>,
    /// How many leading bytes every key shares.
    prefix_len: usize,
}

/// Where one entry lies in `bytes`, with the start of its key as an integer.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Offset of the key in `bytes`; what follows the key is its value (leaf) or its
    /// child reference (branch).
    key_at: u32,
    key_len: u16,
    /// A leaf entry's value tag (unused in branches).
    tag: u8,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("bytes", &self.bytes.len())
            .field("entries", &self.len())
            .field("prefix_len", &self.prefix_len)
            .finish()
    }
}

/// The first 4 bytes of `bytes`, zero-padded, as a big-endian integer: ordered as the
/// bytes are (see [`head_of`]). Four bytes rather than eight halve the array a search
/// scans; a node's keys seldom tie on them once the shared prefix is skipped.
fn head32(bytes: &[u8]) -> u32 {
    u32::try_from(head_of(bytes) >> 32).expect("the top half of a u64")
}

/// The header fields a parse needs.
struct Header {
    level: u8,
    kind: u8,
    count: usize,
}

impl Packed {
    /// Parses and validates a node's bytes (read from disk: the node's self-checksum is
    /// checked here; the pointer's, if there was one, by the reader). Returns the
    /// node's level with its packed form.
    ///
    /// `self_checksum: false` skips the node's own checksum, for bytes a checksum
    /// covering all of them has just vouched for (the parent pointer's, or the
    /// checkpoint's own encoding); the structure is checked all the same.
    #[deny(clippy::indexing_slicing)] // bytes from disk: every index is justified
    pub(crate) fn parse(buf: Vec<u8>, addr: Addr, self_checksum: bool) -> Result<(u8, Packed)> {
        let header = Self::header(&buf, addr, self_checksum)?;
        let mut d = Decoder::new(&buf, "node");
        d.bytes(HEADER_SIZE)?;
        let leaf = header.kind == KIND_LEAF;
        let mut slots = Vec::with_capacity(header.count);
        for _ in 0..header.count {
            let key_len = usize::from(d.u16()?);
            let tag = if leaf { d.u8()? } else { 0 };
            if key_len == 0 || key_len > MAX_KEY_LEN {
                return Err(d.error(format!("key length {key_len} out of range at {addr:?}")));
            }
            let key_at = buf.len() - d.remaining();
            d.bytes(key_len)?;
            match tag {
                _ if !leaf => {
                    BlockRef::decode(&mut d)?;
                }
                VALUE_INLINE => {
                    let len = d.u32()? as usize;
                    d.bytes(len)?;
                }
                VALUE_EXTENT => {
                    BlockRef::decode(&mut d)?;
                }
                _ => return Err(d.error(format!("bad value tag {tag} at {addr:?}"))),
            }
            slots.push(Slot {
                key_at: u32::try_from(key_at).map_err(|_| d.error("node too large"))?,
                key_len: u16::try_from(key_len).map_err(|_| d.error("key too long"))?,
                tag,
            });
        }
        if d.remaining() != 0 {
            return Err(d.error(format!("{} trailing bytes at {addr:?}", d.remaining())));
        }
        if !leaf && slots.is_empty() {
            return Err(d.error(format!("branch node without children at {addr:?}")));
        }
        let key = |s: &Slot| {
            let at = s.key_at as usize;
            buf.get(at..at + usize::from(s.key_len)).unwrap_or_default()
        };
        if slots
            .iter()
            .zip(slots.iter().skip(1))
            .any(|(a, b)| key(a) >= key(b))
        {
            return Err(d.error(format!("keys out of order at {addr:?}")));
        }
        let prefix_len = match (slots.first(), slots.last()) {
            (Some(first), Some(last)) if slots.len() > 1 => key(first)
                .iter()
                .zip(key(last))
                .take_while(|(a, b)| a == b)
                .count(),
            _ => 0,
        };
        let mut index = Vec::with_capacity(3 * slots.len());
        index.extend(
            slots
                .iter()
                .map(|s| head32(key(s).get(prefix_len..).unwrap_or_default())),
        );
        for s in &slots {
            index.extend([s.key_at, u32::from(s.key_len) | u32::from(s.tag) << 16]);
        }
        let packed = Packed {
            index: index.into_boxed_slice(),
            bytes: buf.into_boxed_slice(),
            prefix_len,
        };
        Ok((header.level, packed))
    }

    /// Checks the header and the self-checksum.
    #[deny(clippy::indexing_slicing)]
    fn header(buf: &[u8], addr: Addr, self_checksum: bool) -> Result<Header> {
        let mut d = Decoder::new(buf, "node");
        if d.u32()? != NODE_MAGIC {
            return Err(d.error(format!("bad magic at {addr:?}")));
        }
        let stored_crc = d.u32()?;
        let covered = buf.get(CRC_FROM..).unwrap_or_default();
        if self_checksum && crc(covered) != stored_crc {
            return Err(d.error(format!("self-checksum mismatch at {addr:?}")));
        }
        let kind = d.u8()?;
        let level = d.u8()?;
        d.u16()?; // reserved
        let count = d.u32()? as usize;
        // Every entry takes at least 3 bytes (length and a one-byte key): a count
        // beyond that is corrupt, and must not size an allocation.
        if count > buf.len() / 3 {
            return Err(d.error(format!("entry count {count} exceeds node size at {addr:?}")));
        }
        let valid = match kind {
            KIND_LEAF => level == 0,
            KIND_BRANCH => level > 0 && usize::from(level) < MAX_DEPTH,
            _ => false,
        };
        if !valid {
            return Err(d.error(format!("bad kind {kind} / level {level} at {addr:?}")));
        }
        Ok(Header { level, kind, count })
    }

    /// Entries: the index holds three words for each.
    pub(crate) fn len(&self) -> usize {
        self.index.len() / 3
    }

    /// Every entry's head, in order.
    fn heads(&self) -> &[u32] {
        &self.index[..self.len()]
    }

    /// Entry `i`'s slot.
    fn slot(&self, i: usize) -> Slot {
        let at = self.len() + 2 * i;
        let (key_at, rest) = (self.index[at], self.index[at + 1]);
        Slot {
            key_at,
            key_len: rest as u16,
            tag: (rest >> 16) as u8,
        }
    }

    /// The encoded node, as written.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Memory held: the bytes, the index and the allocations' bookkeeping.
    pub(crate) fn mem_size(&self) -> usize {
        self.bytes.len() + self.index.len() * size_of::<u32>() + 2 * 16
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let s = self.slot(i);
        let at = s.key_at as usize;
        &self.bytes[at..at + usize::from(s.key_len)]
    }

    /// Where entry `i`'s key ends: its value or child reference starts there.
    fn after_key(&self, i: usize) -> usize {
        let s = self.slot(i);
        s.key_at as usize + usize::from(s.key_len)
    }

    /// The block reference encoded at `at` (validated by `parse`).
    fn block_ref(&self, at: usize) -> BlockRef {
        read_block_ref(&self.bytes, at)
    }

    /// Leaf entry `i`'s value.
    pub(crate) fn value(&self, i: usize) -> ValueRef<'_> {
        let at = self.after_key(i);
        if self.slot(i).tag == VALUE_EXTENT {
            return ValueRef::Extent(self.block_ref(at));
        }
        let len = u32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("4 bytes"));
        ValueRef::Inline(&self.bytes[at + 4..at + 4 + len as usize])
    }

    /// Starts fetching entry `i`'s bytes (its value's length follows the key), if
    /// there is such an entry: see [`prefetch`].
    pub(crate) fn prefetch_entry(&self, i: usize) {
        let at = (i < self.len()).then(|| self.after_key(i));
        if let Some(byte) = at.and_then(|at| self.bytes.get(at)) {
            prefetch(byte);
        }
    }

    /// A leaf's entries in editable form: one copy of its entry bytes.
    pub(crate) fn to_leaf_buf(&self) -> LeafBuf {
        LeafBuf::from_encoded(
            &self.bytes[HEADER_SIZE..],
            (0..self.len()).map(|i| self.slot(i).key_at as usize - LEAF_KEY_AT - HEADER_SIZE),
        )
    }

    /// Branch entry `i`'s child: a packed node names its children by address.
    pub(crate) fn child(&self, i: usize) -> BlockRef {
        self.block_ref(self.after_key(i))
    }

    /// Binary search for `key`: `Ok(i)` if entry `i` holds it, else `Err(i)` with
    /// `i` the index where it would be inserted.
    pub(crate) fn search(&self, key: &[u8]) -> std::result::Result<usize, usize> {
        if self.len() == 0 {
            return Err(0);
        }
        let first = self.slot(0);
        // Every key starts with the first key's `prefix_len` bytes: compare them once.
        let p = self.prefix_len;
        let shared = {
            let at = first.key_at as usize;
            &self.bytes[at..at + p]
        };
        let n = p.min(key.len());
        match cmp_bytes(&key[..n], &shared[..n]) {
            Ordering::Less => return Err(0),
            Ordering::Greater => return Err(self.len()),
            // A key that is a proper prefix of the shared prefix sorts before them all.
            Ordering::Equal if key.len() < p => return Err(0),
            Ordering::Equal => {}
        }
        let rest = &key[p..];
        let head = head32(rest);
        // Heads are non-decreasing: the entries below the probe are those whose head
        // is below its head, then those of equal head whose bytes are below.
        let heads = self.heads();
        let lo = heads.iter().filter(|&&h| h < head).count();
        // The entries that tie on the head are searched by halves (they can be many).
        let hi = lo + heads[lo..].iter().take_while(|&&h| h == head).count();
        search_run(lo, hi, |i| {
            let s = self.slot(i);
            let at = s.key_at as usize;
            cmp_bytes(&self.bytes[at + p..at + usize::from(s.key_len)], rest)
        })
    }
}

#[cfg(test)]
mod tests {
    //! Property tests of the packed form: random edits against a sorted-map model,
    //! encode/parse round trips, and damaged buffers (with the self-checksum fixed up,
    //! so that the structural checks, not the checksum, are what is tested) that must
    //! parse to an error or to a node that never answers with a wrong key.
    use super::*;
    use crate::btree::node::{BranchEntry, Child, Key, Node, Value, OFF_CRC};

    use crate::io::sim::SplitMix;
    use std::collections::BTreeMap;

    use crate::btree::node::tests::at;

    fn block(rng: &mut SplitMix) -> BlockRef {
        BlockRef {
            addr: Addr(rng.next_u64() >> 8),
            len: u32::try_from(rng.below(1 << 20)).expect("small") + 1,
            crc: u32::try_from(rng.next_u64() >> 32).expect("32 bits"),
        }
    }

    /// Keys over a tiny alphabet (so keys that are prefixes of others, equal 8-byte
    /// heads and ties past them all occur), sharing a long prefix in most cases (so
    /// the node's shared prefix is not empty), sometimes cut inside the prefix.
    fn gen_key(rng: &mut SplitMix, shared: &[u8]) -> Vec<u8> {
        let take = if rng.chance(3, 4) {
            shared.len()
        } else {
            usize::try_from(rng.below(shared.len() as u64 + 1)).expect("small")
        };
        let mut k = shared[..take].to_vec();
        for _ in 0..rng.below(14) {
            k.push(b"ab\x00\xff"[usize::try_from(rng.below(4)).expect("small")]);
        }
        if k.is_empty() {
            k.push(b'a');
        }
        k
    }

    fn gen_shared(rng: &mut SplitMix) -> Vec<u8> {
        let len = [0, 3, 8, 13][usize::try_from(rng.below(4)).expect("small")];
        (0..len).map(|i| b'k' + (i % 7) as u8).collect()
    }

    fn gen_value(rng: &mut SplitMix) -> Value {
        if rng.chance(1, 5) {
            Value::Extent(block(rng))
        } else {
            let len = usize::try_from(rng.below(40)).expect("small");
            Value::Inline((0..len).map(|i| i as u8 ^ 0x5a).collect::<Vec<u8>>().into())
        }
    }

    fn packed(node: &Node) -> (Vec<u8>, Node) {
        let mut buf = Vec::new();
        node.encode(&mut buf);
        let back = Node::decode(buf.clone(), at(buf.len())).expect("an encoded node parses");
        assert!(matches!(back.body, Body::Packed(_)));
        (buf, back)
    }

    /// What `search` must answer for `probe` over the model's keys.
    fn expected<V>(
        model: &BTreeMap<Vec<u8>, V>,
        probe: &[u8],
    ) -> std::result::Result<usize, usize> {
        let below = model.keys().filter(|k| k.as_slice() < probe).count();
        if model.contains_key(probe) {
            Ok(below)
        } else {
            Err(below)
        }
    }

    use crate::btree::node::Body;

    #[test]
    fn random_leaf_edits_match_a_sorted_map() {
        let mut rng = SplitMix(0x9ac4ed);
        for case in 0..300 {
            let shared = gen_shared(&mut rng);
            let mut model: BTreeMap<Vec<u8>, Value> = BTreeMap::new();
            let mut node = Node::new_leaf(LeafBuf::default(), 1);
            for round in 0..4 {
                // Edit the editable form, as a writer does after shadowing.
                let Body::Leaf(mut entries) = node.body else {
                    panic!("editable form expected")
                };
                for _ in 0..rng.below(40) {
                    let key = gen_key(&mut rng, &shared);
                    let pos = entries.search(&key);
                    if rng.chance(1, 4) {
                        if let Ok(i) = pos {
                            entries.remove(i);
                        }
                        model.remove(&key);
                    } else {
                        let value = gen_value(&mut rng);
                        match pos {
                            Ok(i) => entries.set_value(i, value.as_ref()),
                            Err(i) => entries.insert(i, &key, value.as_ref()),
                        }
                        model.insert(key, value);
                    }
                }
                let edited = Node::new_leaf(entries, 1);
                let (bytes, p) = packed(&edited);
                let ctx = format!("case {case} round {round}");
                assert_eq!(p.len(), model.len(), "{ctx}");
                for (i, (k, v)) in model.iter().enumerate() {
                    assert_eq!(p.key(i), &k[..], "{ctx}");
                    assert_eq!(p.value(i), v.as_ref(), "{ctx}");
                    assert_eq!(p.search(k), Ok(i), "{ctx}");
                }
                for _ in 0..50 {
                    let probe = gen_key(&mut rng, &shared);
                    assert_eq!(
                        p.search(&probe),
                        expected(&model, &probe),
                        "{ctx} {probe:?}"
                    );
                }
                // Round trips: the packed node encodes to its bytes, and so does its
                // unpacked copy.
                let mut again = Vec::new();
                p.encode(&mut again);
                assert_eq!(again, bytes, "{ctx}");
                node = p.dirty_copy(2, u64::MAX);
                assert_eq!(node.size, bytes.len(), "{ctx}");
                let mut unpacked = Vec::new();
                node.encode(&mut unpacked);
                assert_eq!(unpacked, bytes, "{ctx}");
            }
        }
    }

    #[test]
    fn random_branches_route_like_a_sorted_map() {
        let mut rng = SplitMix(0xb4a9c4);
        for case in 0..300 {
            let shared = gen_shared(&mut rng);
            let mut model: BTreeMap<Vec<u8>, BlockRef> = BTreeMap::new();
            for _ in 0..=rng.below(60) {
                model.insert(gen_key(&mut rng, &shared), block(&mut rng));
            }
            let entries = model
                .iter()
                .map(|(k, r)| BranchEntry {
                    key: Key::from(&k[..]),
                    child: Child::Disk(*r),
                })
                .collect();
            let (_, p) = packed(&Node::new_branch(3, entries, 1));
            assert_eq!(p.level, 3);
            for (i, (k, r)) in model.iter().enumerate() {
                assert_eq!(p.key(i), &k[..], "case {case}");
                assert_eq!(p.child(i).disk_ref(), Some(*r), "case {case}");
            }
            for _ in 0..50 {
                let probe = gen_key(&mut rng, &shared);
                let at_or_below = model.keys().filter(|k| **k <= probe).count();
                assert_eq!(
                    p.child_index(&probe),
                    at_or_below.saturating_sub(1),
                    "case {case} {probe:?}"
                );
            }
        }
    }

    /// A damaged node whose self-checksum was recomputed (as a bug, or a deliberate
    /// forger, would leave it) must parse to an error or to a node whose every
    /// accessor works and whose searches only ever find the key they were given.
    #[test]
    fn a_damaged_buffer_never_panics_and_never_finds_a_wrong_key() {
        let mut rng = SplitMix(0xc0441d);
        let mut parsed_anyway = 0;
        for case in 0..400 {
            let shared = gen_shared(&mut rng);
            let mut model: BTreeMap<Vec<u8>, Value> = BTreeMap::new();
            for _ in 0..=rng.below(30) {
                model.insert(gen_key(&mut rng, &shared), gen_value(&mut rng));
            }
            let leaf = case % 2 == 0;
            let node = if leaf {
                let entries = model.iter().map(|(k, v)| (&k[..], v.as_ref()));
                Node::new_leaf(LeafBuf::from_entries(entries), 1)
            } else {
                let entries = model
                    .keys()
                    .map(|k| BranchEntry {
                        key: Key::from(&k[..]),
                        child: Child::Disk(block(&mut rng)),
                    })
                    .collect();
                Node::new_branch(1, entries, 1)
            };
            let mut buf = Vec::new();
            node.encode(&mut buf);
            for _ in 0..20 {
                let mut bad = buf.clone();
                match rng.below(3) {
                    0 => {
                        let i = usize::try_from(rng.below(bad.len() as u64)).expect("small");
                        bad[i] ^= 1 << rng.below(8);
                    }
                    1 => {
                        let i = usize::try_from(rng.below(bad.len() as u64)).expect("small");
                        bad[i] = u8::try_from(rng.below(256)).expect("a byte");
                        let j = usize::try_from(rng.below(bad.len() as u64)).expect("small");
                        bad[j] = u8::try_from(rng.below(256)).expect("a byte");
                    }
                    _ => {
                        let cut = usize::try_from(rng.below(bad.len() as u64)).expect("small");
                        bad.truncate(cut.max(CRC_FROM));
                    }
                }
                // Unchanged bytes would be a valid node: nothing to test.
                if bad == buf {
                    continue;
                }
                assert!(
                    Node::decode(bad.clone(), at(bad.len())).is_err(),
                    "case {case}: damage passed the self-checksum"
                );
                let sum = crate::format::crc(&bad[CRC_FROM..]);
                bad[OFF_CRC..OFF_CRC + 4].copy_from_slice(&sum.to_le_bytes());
                let Ok(p) = Node::decode(bad, at(0)) else {
                    continue;
                };
                parsed_anyway += 1;
                for i in 0..p.len() {
                    let key = p.key(i).to_vec();
                    if p.is_leaf() {
                        let _ = p.value(i);
                    } else {
                        let _ = p.child(i);
                    }
                    assert_eq!(p.search(&key), Ok(i), "case {case}: keys parse sorted");
                }
                let probes = model
                    .keys()
                    .cloned()
                    .chain((0..10).map(|_| gen_key(&mut rng, &shared)));
                for probe in probes {
                    if let Ok(i) = p.search(&probe) {
                        assert_eq!(p.key(i), &probe[..], "case {case}: a wrong key");
                    }
                    if !p.is_leaf() {
                        assert!(p.child_index(&probe) < p.len());
                    }
                }
            }
        }
        // Some damage leaves a well-formed node (a flipped value byte): the loop above
        // must have exercised that path, not only refusals.
        assert!(parsed_anyway > 0);
    }

    #[test]
    fn keys_out_of_order_are_corruption() {
        let entries = [b"a", b"b"].map(|k| (&k[..], ValueRef::Inline(b"v")));
        let node = Node::new_leaf(LeafBuf::from_entries(entries), 1);
        let mut buf = Vec::new();
        node.encode(&mut buf);
        // Swap the two one-byte keys (each entry: key length u16, tag u8, key, value of
        // 4 + 1 bytes) and fix the checksum up: the structure is what must be refused.
        let (first, second) = (HEADER_SIZE + 3, HEADER_SIZE + 3 + 1 + 5 + 3);
        buf.swap(first, second);
        let sum = crate::format::crc(&buf[CRC_FROM..]);
        buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&sum.to_le_bytes());
        let err = Node::decode(buf, at(0)).expect_err("unsorted keys");
        assert!(err.is_corruption(), "{err}");
    }

    #[test]
    fn shared_prefix_and_short_probes() {
        let keys: [&[u8]; 4] = [b"user:0001", b"user:0002", b"user:0010", b"user:1"];
        let entries = keys.iter().map(|k| (*k, ValueRef::Inline(k)));
        let (_, p) = packed(&Node::new_leaf(LeafBuf::from_entries(entries), 1));
        let Body::Packed(inner) = &p.body else {
            panic!("packed")
        };
        assert_eq!(inner.prefix_len, 5, "\"user:\" is shared");
        assert_eq!(p.search(b"user:"), Err(0), "a probe inside the prefix");
        assert_eq!(p.search(b"user"), Err(0));
        assert_eq!(p.search(b"a"), Err(0));
        assert_eq!(p.search(b"z"), Err(4));
        assert_eq!(p.search(b"user:0002"), Ok(1));
        assert_eq!(p.search(b"user:00020"), Err(2));
        assert_eq!(p.search(b"user:2"), Err(4));
        assert_eq!(p.value(3), ValueRef::Inline(b"user:1"));
    }
}
