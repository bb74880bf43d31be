//! Tree nodes in memory and on disk.
//!
//! A node is a leaf (keys with values) or a branch (keys with child references).
//! Branch keys follow Rodeh's min-key rule: entry `i` holds a key that is `<=` every
//! key in child `i`'s subtree and `>` every key in child `i-1`'s subtree, so a search
//! picks the last entry whose key is `<=` the search key.
//!
//! In memory a child is either `Disk` (a [`BlockRef`] to load through the page cache)
//! or `Mem` (an `Arc<Node>`). A `Mem` node whose `disk` cell is empty is *dirty*: it has
//! not been written yet and will be, exactly once, by the next checkpoint. Once a
//! checkpoint writes it, `disk` is set and the node is clean; clean nodes are never
//! modified again (a writer copies them first, which is the shadowing step).
//!
//! On-disk layout (little-endian; see docs/FORMAT.md):
//! ```text
//! header  magic u32 "CNOD" | crc u32 (over bytes 8..) | kind u8 | level u8 | reserved u16 | count u32
//! leaf    per entry: key_len u16 | value_tag u8 | key | inline: value_len u32, value
//!                                                     | extent: BlockRef (addr u64, len u32, crc u32)
//! branch  per entry: key_len u16 | key | BlockRef
//! ```

use super::leaf::LeafBuf;
use super::packed::Packed;
use crate::error::Result;
use crate::format::{crc, len_u16, len_u32, put_u16, BlockRef};
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, OnceLock, Weak};

use super::layout::{cmp_bytes, head_of};
pub(crate) use super::layout::{
    ValueRef, BRANCH_ENTRY_MAX, CRC_FROM, HEADER_SIZE, KIND_BRANCH, KIND_LEAF, LEAF_ENTRY_MAX,
    MAX_DEPTH, MERGE_MAX, NODE_MAGIC, NODE_MAX, NODE_MIN, OFF_COUNT, OFF_CRC, OFF_KIND, OFF_LEVEL,
    OFF_MAGIC,
};

/// A leaf's value held apart from its node (a diff's result): inline bytes, or a
/// reference to its own extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    Inline(Arc<[u8]>),
    Extent(BlockRef),
}

impl Value {
    pub(crate) fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Inline(v) => ValueRef::Inline(v),
            Value::Extent(r) => ValueRef::Extent(*r),
        }
    }
}

impl ValueRef<'_> {
    pub(crate) fn to_owned(self) -> Value {
        match self {
            ValueRef::Inline(v) => Value::Inline(v.into()),
            ValueRef::Extent(r) => Value::Extent(r),
        }
    }
}

/// A child as a reader sees it, in either form of node.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChildRef<'a> {
    Disk(BlockRef),
    Mem(&'a Arc<Node>),
}

impl ChildRef<'_> {
    pub(crate) fn to_owned(self) -> Child {
        match self {
            ChildRef::Disk(r) => Child::Disk(r),
            ChildRef::Mem(n) => Child::Mem(Arc::clone(n)),
        }
    }

    pub(crate) fn disk_ref(self) -> Option<BlockRef> {
        match self {
            ChildRef::Disk(r) => Some(r),
            ChildRef::Mem(n) => n.disk.get().copied(),
        }
    }
}

/// A reference to a child node.
#[derive(Clone, Debug)]
pub(crate) enum Child {
    Disk(BlockRef),
    Mem(Arc<Node>),
}

impl Child {
    pub(crate) fn as_ref(&self) -> ChildRef<'_> {
        match self {
            Child::Disk(r) => ChildRef::Disk(*r),
            Child::Mem(n) => ChildRef::Mem(n),
        }
    }

    /// The child's on-disk reference, if it has been written.
    pub(crate) fn disk_ref(&self) -> Option<BlockRef> {
        match self {
            Child::Disk(r) => Some(*r),
            Child::Mem(n) => n.disk.get().copied(),
        }
    }

    /// The same child, as a `Disk` reference when it has been written (so that holding
    /// it does not pin the node in memory).
    pub(crate) fn unpinned(&self) -> Child {
        match self.disk_ref() {
            Some(r) => Child::Disk(r),
            None => self.clone(),
        }
    }
}

/// A key (shared, so copying a node for copy-on-write bumps reference counts instead
/// of allocating), with its first 8 bytes also kept as a big-endian integer: searches compare
/// that integer first and touch the key's own allocation only on a tie, so a binary
/// search over a node reads one contiguous array instead of chasing a pointer per probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    prefix: u64,
    bytes: Arc<[u8]>,
}

/// A search key in the same form.
#[derive(Clone, Copy)]
pub(crate) struct Probe<'a> {
    prefix: u64,
    bytes: &'a [u8],
}

impl Key {
    pub(crate) fn cmp_probe(&self, probe: &Probe<'_>) -> std::cmp::Ordering {
        match self.prefix.cmp(&probe.prefix) {
            std::cmp::Ordering::Equal => cmp_bytes(&self.bytes, probe.bytes),
            other => other,
        }
    }
}

impl<'a> Probe<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Probe {
            prefix: head_of(bytes),
            bytes,
        }
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl From<&[u8]> for Key {
    fn from(bytes: &[u8]) -> Key {
        Key {
            prefix: head_of(bytes),
            bytes: bytes.into(),
        }
    }
}

impl From<Arc<[u8]>> for Key {
    fn from(bytes: Arc<[u8]>) -> Key {
        Key {
            prefix: head_of(&bytes),
            bytes,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct BranchEntry {
    pub key: Key,
    pub child: Child,
}

/// A node's entries. Dirty nodes (and copies a writer is editing) hold an editable
/// form: a leaf its entry bytes in one buffer (`leaf.rs`), a branch one entry per
/// child (children may be in memory); a node read from disk is `Packed`, its bytes as
/// written (see `packed.rs`), and is never edited: `Node::dirty_copy` unpacks it.
#[derive(Debug)]
pub(crate) enum Body {
    Leaf(LeafBuf),
    Branch(Vec<BranchEntry>),
    Packed(Packed),
}

/// A tree node. See the module docs for the dirty/clean life cycle.
#[derive(Debug)]
pub(crate) struct Node {
    /// 0 for leaves; a branch's level is its children's plus one.
    pub level: u8,
    pub body: Body,
    /// Encoded size in bytes, kept up to date by every edit.
    pub size: usize,
    /// The checkpoint epoch in which this node was made dirty (meaningless once clean).
    pub epoch: u64,
    /// Where the node was written, once it has been.
    pub disk: OnceLock<BlockRef>,
    /// A packed branch's links to its children in memory, one per entry (empty for
    /// every other node), set by the first reader that loads each child through
    /// this node (`Loader::child_at`). A link is weak: the page cache owns the
    /// child; a reader that finds it alive skips the cache's lookup, and one that
    /// finds it dead (evicted) goes through the cache. A link is set once: a child
    /// evicted and read again is found through the cache from then on.
    links: Box<[OnceLock<Weak<Node>>]>,
    /// The page cache's CLOCK credit (see `cache.rs`), kept in the node so that a
    /// reader arriving through a link refreshes it too.
    pub credit: AtomicU8,
}

pub(crate) fn branch_entry_size(key_len: usize) -> usize {
    2 + key_len + BlockRef::SIZE
}

impl Node {
    pub(crate) fn new_leaf(entries: LeafBuf, epoch: u64) -> Node {
        let size = HEADER_SIZE + entries.encoded_size();
        Node::dirty(0, Body::Leaf(entries), size, epoch)
    }

    pub(crate) fn new_branch(level: u8, entries: Vec<BranchEntry>, epoch: u64) -> Node {
        assert!(level > 0);
        let size = HEADER_SIZE
            + entries
                .iter()
                .map(|e| branch_entry_size(e.key.len()))
                .sum::<usize>();
        Node::dirty(level, Body::Branch(entries), size, epoch)
    }

    /// A node not written yet, made dirty in `epoch`.
    fn dirty(level: u8, body: Body, size: usize, epoch: u64) -> Node {
        Node {
            level,
            body,
            size,
            epoch,
            disk: OnceLock::new(),
            links: Box::default(),
            credit: AtomicU8::new(0),
        }
    }

    /// A dirty copy of this node for a writer in `epoch`, in the editable form (a
    /// packed node is unpacked here, once). Children that are already written are
    /// referenced by address, so the copy does not pin them in memory: reads reach
    /// them through the page cache, in their packed form.
    ///
    /// A child is named by address only if its reference count is in the table by
    /// that address, i.e. it was made dirty in an epoch up to `merged_through` (see
    /// `btree::refcount`).
    pub(crate) fn dirty_copy(&self, epoch: u64, merged_through: u64) -> Node {
        let body = match &self.body {
            Body::Leaf(entries) => Body::Leaf(entries.clone()),
            Body::Branch(entries) => Body::Branch(
                entries
                    .iter()
                    .map(|e| BranchEntry {
                        key: e.key.clone(),
                        child: match &e.child {
                            Child::Mem(n) if n.epoch <= merged_through => e.child.unpinned(),
                            other => other.clone(),
                        },
                    })
                    .collect(),
            ),
            Body::Packed(p) if self.level == 0 => Body::Leaf(p.to_leaf_buf()),
            Body::Packed(p) => Body::Branch(
                (0..p.len())
                    .map(|i| BranchEntry {
                        key: p.key(i).into(),
                        child: Child::Disk(p.child(i)),
                    })
                    .collect(),
            ),
        };
        Node::dirty(self.level, body, self.size, epoch)
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.disk.get().is_none()
    }

    pub(crate) fn is_leaf(&self) -> bool {
        self.level == 0
    }

    pub(crate) fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(e) => e.len(),
            Body::Branch(e) => e.len(),
            Body::Packed(p) => p.len(),
        }
    }

    /// Entry `i`'s key. Panics if `i` is out of range, as slice indexing does.
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        match &self.body {
            Body::Leaf(l) => l.key(i),
            Body::Branch(e) => &e[i].key,
            Body::Packed(p) => p.key(i),
        }
    }

    /// Leaf entry `i`'s value. Panics on a branch: callers check the level first.
    pub(crate) fn value(&self, i: usize) -> ValueRef<'_> {
        match &self.body {
            Body::Leaf(l) => l.value(i),
            Body::Packed(p) if self.level == 0 => p.value(i),
            _ => panic!("value of a branch entry"),
        }
    }

    /// Starts fetching leaf entry `i` from memory, ahead of a scan reaching it (a
    /// packed leaf's; an editable one is in the writer's hands, and likely cached).
    pub(crate) fn prefetch_entry(&self, i: usize) {
        if let Body::Packed(p) = &self.body {
            p.prefetch_entry(i);
        }
    }

    /// Branch entry `i`'s child. Panics on a leaf: callers check the level first.
    pub(crate) fn child(&self, i: usize) -> ChildRef<'_> {
        match &self.body {
            Body::Branch(e) => e[i].child.as_ref(),
            Body::Packed(p) if self.level > 0 => ChildRef::Disk(p.child(i)),
            _ => panic!("child of a leaf entry"),
        }
    }

    /// Branch entry `i`'s child if it is in memory by reference (an editable branch's
    /// dirty child), without reading a written child's address.
    pub(crate) fn mem_child(&self, i: usize) -> Option<&Arc<Node>> {
        match &self.body {
            Body::Branch(e) => match &e.get(i)?.child {
                Child::Mem(node) => Some(node),
                Child::Disk(_) => None,
            },
            _ => None,
        }
    }

    /// The child of branch entry `i` as last loaded through this node, if a link was
    /// set and the child is still in memory.
    pub(crate) fn linked_child(&self, i: usize) -> Option<Arc<Node>> {
        self.links.get(i)?.get()?.upgrade()
    }

    /// Whether branch entry `i` links to a child still in memory (no reference
    /// taken: a look, for a read-ahead deciding what to ask the OS for).
    pub(crate) fn has_live_link(&self, i: usize) -> bool {
        self.links
            .get(i)
            .and_then(|l| l.get())
            .is_some_and(|w| w.strong_count() > 0)
    }

    /// Links branch entry `i` to `child`, just loaded through it (and checked
    /// against it), unless a link was set already.
    pub(crate) fn link_child(&self, i: usize, child: &Arc<Node>) {
        if let Some(link) = self.links.get(i) {
            let _ = link.set(Arc::downgrade(child));
        }
    }

    /// Binary search for `key`: `Ok(i)` if entry `i` holds it, else `Err(i)` with `i`
    /// where it would go.
    pub(crate) fn search(&self, key: &[u8]) -> std::result::Result<usize, usize> {
        match &self.body {
            Body::Packed(p) => p.search(key),
            Body::Leaf(l) => l.search(key),
            Body::Branch(e) => {
                let probe = Probe::new(key);
                e.binary_search_by(|e| e.key.cmp_probe(&probe))
            }
        }
    }

    /// The index of the child to descend into for `key`: the last entry whose key is
    /// `<= key`, or the first when `key` is below all of them.
    pub(crate) fn child_index(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        }
    }

    /// The keys, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.key(i))
    }

    /// A branch's children, in order (none for a leaf).
    pub(crate) fn children(&self) -> impl Iterator<Item = ChildRef<'_>> + '_ {
        let n = if self.is_leaf() { 0 } else { self.len() };
        (0..n).map(|i| self.child(i))
    }

    /// A leaf's out-of-line values with their keys (none for a branch).
    pub(crate) fn extents(&self) -> impl Iterator<Item = (&[u8], BlockRef)> + '_ {
        let n = match &self.body {
            Body::Leaf(l) if l.has_extents() => l.len(),
            Body::Packed(p) if self.level == 0 => p.len(),
            _ => 0,
        };
        (0..n).filter_map(|i| self.value(i).extent().map(|r| (self.key(i), r)))
    }

    /// The smallest key in the node (its first entry's), if any.
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        (self.len() > 0).then(|| self.key(0))
    }

    /// Serialises the node. Branch children must all be written already (the
    /// checkpoint writes bottom-up, so they are).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let (kind, count) = match &self.body {
            Body::Leaf(e) => (KIND_LEAF, e.len()),
            Body::Branch(e) => (KIND_BRANCH, e.len()),
            Body::Packed(p) => {
                // Already encoded: the bytes as written.
                out.extend_from_slice(p.bytes());
                return;
            }
        };
        let mut header = [0u8; HEADER_SIZE];
        header[OFF_MAGIC..OFF_CRC].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        // The crc (at OFF_CRC) is patched in below; the reserved field stays zero.
        header[OFF_KIND] = kind;
        header[OFF_LEVEL] = self.level;
        header[OFF_COUNT..HEADER_SIZE].copy_from_slice(&len_u32(count).to_le_bytes());
        out.extend_from_slice(&header);
        match &self.body {
            Body::Leaf(entries) => entries.encode_entries(out),
            Body::Branch(entries) => {
                for e in entries {
                    put_u16(out, len_u16(e.key.len()));
                    out.extend_from_slice(&e.key);
                    let r = e
                        .child
                        .disk_ref()
                        .expect("checkpoint writes children before parents");
                    r.encode(out);
                }
            }
            Body::Packed(_) => unreachable!("returned above"),
        }
        let crc = crc(&out[start + CRC_FROM..]);
        out[start + OFF_CRC..start + OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(
            out.len() - start,
            self.size,
            "node size bookkeeping drifted"
        );
    }

    /// Parses a node's bytes into its packed form, checking the node's own checksum,
    /// header and structure (the caller checks the parent pointer's checksum, when it
    /// has one). The result is clean, written at `at`.
    pub(crate) fn decode(buf: Vec<u8>, at: BlockRef) -> Result<Node> {
        Self::parse(buf, at, true)
    }

    /// [`Node::decode`] of bytes just checked against `at.crc`, which covers all of
    /// them: the node's own checksum would only say the same again.
    pub(crate) fn decode_checked(buf: Vec<u8>, at: BlockRef) -> Result<Node> {
        debug_assert_eq!(
            crc(&buf),
            at.crc,
            "the caller checked the pointer's checksum"
        );
        Self::parse(buf, at, false)
    }

    fn parse(buf: Vec<u8>, at: BlockRef, self_checksum: bool) -> Result<Node> {
        let size = buf.len();
        let (level, packed) = Packed::parse(buf, at.addr, self_checksum)?;
        let links = match level {
            0 => Box::default(),
            _ => (0..packed.len()).map(|_| OnceLock::new()).collect(),
        };
        let node = Node {
            level,
            body: Body::Packed(packed),
            size,
            epoch: 0,
            disk: OnceLock::new(),
            links,
            credit: AtomicU8::new(0),
        };
        let _ = node.disk.set(at);
        Ok(node)
    }

    /// Test support: this node as it reads back from disk, written at `at`.
    #[cfg(test)]
    pub(crate) fn packed(&self, at: BlockRef) -> Node {
        let mut buf = Vec::new();
        self.encode(&mut buf);
        Node::decode(buf, at).expect("an encoded node parses")
    }

    /// Bytes of memory the node holds, for the cache budget: what the allocator was
    /// asked for, plus a fixed allowance per allocation for its bookkeeping (the
    /// `Arc`, and for an editable branch each key's own allocation).
    pub(crate) fn mem_size(&self) -> usize {
        const PER_ALLOCATION: usize = 16;
        let fixed = size_of::<Node>() + 2 * size_of::<usize>() + PER_ALLOCATION;
        let links = match self.links.len() {
            0 => 0,
            n => n * size_of::<OnceLock<Weak<Node>>>() + PER_ALLOCATION,
        };
        fixed
            + links
            + match &self.body {
                Body::Packed(p) => p.mem_size(),
                Body::Leaf(l) => l.mem_size() + 2 * PER_ALLOCATION,
                Body::Branch(e) => {
                    e.len() * (size_of::<BranchEntry>() + PER_ALLOCATION + 16)
                        + self.size
                        + PER_ALLOCATION
                }
            }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use crate::format::{Addr, SegmentId};

    pub(crate) fn at(len: usize) -> BlockRef {
        BlockRef {
            addr: Addr::new(SegmentId(1), 64),
            len: len_u32(len),
            crc: 0,
        }
    }

    #[test]
    fn leaf_round_trip() {
        let ext = BlockRef {
            addr: Addr::new(SegmentId(3), 99),
            len: 5000,
            crc: 42,
        };
        let node = Node::new_leaf(
            LeafBuf::from_entries([
                (&b"a"[..], ValueRef::Inline(b"one")),
                (&b"b"[..], ValueRef::Extent(ext)),
            ]),
            1,
        );
        let mut buf = Vec::new();
        node.encode(&mut buf);
        assert_eq!(buf.len(), node.size);
        let back = Node::decode(buf, at(node.size)).unwrap();
        assert!(back.is_leaf());
        assert_eq!(back.key(0), b"a");
        assert_eq!(back.value(0), ValueRef::Inline(b"one"));
        assert_eq!(back.value(1), ValueRef::Extent(ext));
    }

    #[test]
    fn every_truncation_and_flip_is_an_error_or_a_different_node() {
        let keys: Vec<[u8; 2]> = (0..20u8).map(|i| [b'k', i]).collect();
        let values: Vec<[u8; 9]> = (0..20u8).map(|i| [i; 9]).collect();
        let node = Node::new_leaf(
            LeafBuf::from_entries(
                keys.iter()
                    .zip(&values)
                    .map(|(k, v)| (&k[..], ValueRef::Inline(v))),
            ),
            1,
        );
        let mut buf = Vec::new();
        node.encode(&mut buf);
        for cut in 0..buf.len() {
            assert!(Node::decode(buf[..cut].to_vec(), at(cut)).is_err());
        }
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x40;
            assert!(
                Node::decode(b.clone(), at(b.len())).is_err(),
                "flip at {i} undetected"
            );
        }
    }
}
