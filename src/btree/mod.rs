//! The copy-on-write B+tree (Rodeh §4): top-down proactive split and fix, shadowing on
//! the way down, min-key rule, no leaf chaining.
//!
//! Invariants:
//! - Keys within a node are strictly increasing. Branch entry `i`'s key is `<=` every
//!   key below child `i` and `>` every key below child `i - 1` (the min-key rule).
//! - A branch at level `l` has children at level `l - 1`; leaves are level 0.
//! - Writers never modify a node another version or reader can see: `shadow` copies a
//!   clean or shared node first (see `write.rs`). Splits and fixes happen on the way
//!   down, so a change never propagates upward.
//! - Every non-root node is at most `NODE_MAX` bytes, plus, for branches, the one
//!   entry a split may add after the proactive check (node sizes are soft limits:
//!   nodes are written packed, never into fixed pages).

pub(crate) mod cache;
pub(crate) mod cursor;
pub(crate) mod diff;
mod layout;
pub(crate) mod leaf;
pub(crate) mod node;
pub(crate) mod packed;
pub(crate) mod refcount;
pub(crate) mod walk;
mod write;

pub(crate) use write::{
    delete, end_backrefs, insert, insert_run, node_children, OldValue, WriteCtx,
};

use crate::btree::cache::{Admission, PageCache};
use crate::error::{Error, Result};
use crate::format::{crc, len_u32, Addr, BlockRef};
use crate::space::Segments;
use node::{BranchEntry, Child, ChildRef, Node, Probe, ValueRef, MAX_DEPTH};
use std::cmp::Ordering;
use std::sync::Arc;

/// Resolves child references to nodes: in-memory ones directly, written ones through
/// the page cache, reading and verifying from a segment on a miss.
#[derive(Clone, Copy)]
pub(crate) struct Loader<'a> {
    pub cache: &'a PageCache,
    pub segments: &'a Segments,
}

impl Loader<'_> {
    pub(crate) fn load(&self, r: BlockRef) -> Result<Arc<Node>> {
        if let Some(n) = self.cached(r)? {
            return Ok(n);
        }
        let node = self.read(r)?;
        if self.cache.insert_read(r.addr, node.clone()) == Admission::SecondRead {
            // Hot now in both caches; ours serves it from here.
            self.segments.forget_cached(r);
        }
        Ok(node)
    }

    /// The node at `r` if the cache has it (a hit or a miss is counted).
    fn cached(&self, r: BlockRef) -> Result<Option<Arc<Node>>> {
        if let Some(n) = self.cache.get(r.addr) {
            // A node read ahead (`Loader::read_ahead`) was cached on its own checksum;
            // the pointer's must agree, as a read's would have to.
            if n.disk
                .get()
                .is_some_and(|d| d.crc != r.crc || d.len != r.len)
            {
                return Err(Error::corrupted(
                    "node",
                    format!("checksum mismatch at {:?} ({} bytes)", r.addr, r.len),
                ));
            }
            return Ok(Some(n));
        }
        Ok(None)
    }

    /// The node at `r` for a writer about to copy it and, most often, free it: from
    /// the cache if it is there, else read and checked as [`Loader::load`] does but
    /// not cached (caching it would evict a node that stays live, for one that is
    /// about to go).
    pub(crate) fn load_to_copy(&self, r: BlockRef) -> Result<Arc<Node>> {
        match self.cached(r)? {
            Some(n) => Ok(n),
            None => self.read(r),
        }
    }

    /// Reads the node at `r` from its segment, checking its checksum and structure.
    fn read(&self, r: BlockRef) -> Result<Arc<Node>> {
        let buf = self.segments.read(r, "node")?;
        Ok(Arc::new(Node::decode_checked(buf, r)?))
    }

    /// Caches the node whose `bytes` were read at `addr` without a pointer to check
    /// them against (the cleaner reads ahead what its relocation will load). Only a
    /// node that passes its own checksum is cached, and a later [`Loader::load`]
    /// still compares the pointer's checksum with these bytes'. Returns whether it
    /// cached one.
    pub(crate) fn cache_read_ahead(&self, addr: Addr, bytes: &[u8]) -> bool {
        let at = BlockRef {
            addr,
            len: len_u32(bytes.len()),
            crc: crc(bytes),
        };
        match Node::decode(bytes.to_vec(), at) {
            Ok(node) => {
                self.cache.insert(addr, Arc::new(node));
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn resolve(&self, child: &Child) -> Result<Arc<Node>> {
        self.resolve_ref(child.as_ref())
    }

    pub(crate) fn resolve_ref(&self, child: ChildRef<'_>) -> Result<Arc<Node>> {
        match child {
            ChildRef::Mem(n) => Ok(n.clone()),
            ChildRef::Disk(r) => self.load(r),
        }
    }

    /// Resolves a child of a branch at `parent_level`, checking the level on the way
    /// (a corrupted pointer must not send a descent into the wrong kind of node).
    pub(crate) fn child_of(&self, parent_level: u8, child: ChildRef<'_>) -> Result<Arc<Node>> {
        let node = self.resolve_ref(child)?;
        if node.level + 1 != parent_level {
            return Err(Error::corrupted(
                "node",
                format!(
                    "child at level {} under a parent at level {parent_level} ({:?})",
                    node.level,
                    child.disk_ref()
                ),
            ));
        }
        Ok(node)
    }

    /// The child of `parent`'s branch entry `i`: in memory, through the link the
    /// first load set (no cache lookup, and no checks: they passed when the link was
    /// set), or loaded and checked as [`Loader::child_of`] does, then linked.
    pub(crate) fn child_at(&self, parent: &Node, i: usize) -> Result<Arc<Node>> {
        // The link first: a linked child needs no address, and reading the address
        // from the parent's bytes is a memory miss of its own.
        if let Some(node) = parent.linked_child(i) {
            self.cache.touch(&node);
            return Ok(node);
        }
        let child = parent.child(i);
        if let ChildRef::Mem(_) = child {
            return self.child_of(parent.level, child);
        }
        let node = self.child_of(parent.level, child)?;
        // A link is set once: not to a leaf the cache refused (it is dropped after
        // this read, the link with it, and a later read that admits it could not link
        // it again).
        if node.level > 0
            || child
                .disk_ref()
                .is_some_and(|r| self.cache.contains(r.addr))
        {
            parent.link_child(i, &node);
        }
        Ok(node)
    }

    /// Asks the OS to read `parent`'s children at `indices` that are written and
    /// neither linked nor cached, neighbours in a file in one request (nodes written
    /// together lie back to back): a read-ahead for a scan or a walk, since the OS
    /// reads node segments only as asked. Returns the last index looked at.
    pub(crate) fn ask_for_children(
        &self,
        parent: &Node,
        indices: impl Iterator<Item = usize>,
    ) -> Option<usize> {
        let mut last = None;
        let blocks = indices.filter_map(|i| {
            last = Some(i);
            if parent.has_live_link(i) {
                return None;
            }
            match parent.child(i) {
                ChildRef::Disk(r) if !self.cache.contains(r.addr) => Some((r.addr, r.len)),
                ChildRef::Disk(_) | ChildRef::Mem(_) => None,
            }
        });
        self.segments.will_need_blocks(blocks);
        last
    }

    /// Reads an out-of-line value.
    pub(crate) fn extent(&self, r: BlockRef) -> Result<Vec<u8>> {
        self.segments.read(r, "extent")
    }

    pub(crate) fn value(&self, v: ValueRef<'_>) -> Result<Vec<u8>> {
        match v {
            ValueRef::Inline(b) => Ok(b.to_vec()),
            ValueRef::Extent(r) => self.extent(r),
        }
    }
}

/// The index of the child to descend into for `key` among a writer's editable branch
/// entries: the last entry whose key is `<= key`, or the first when `key` is below all
/// of them (`Node::child_index` is the same for a node of either form).
pub(crate) fn child_index(entries: &[BranchEntry], key: &Probe<'_>) -> usize {
    // A binary search whose probes are memory misses on a large tree (a branch's 160
    // entries span ~120 cache lines): before each probe, fetch the two entries the
    // next step may read, so that step's miss overlaps this one's.
    // Invariant: entries before `lo` are `<= key`, entries from `lo + len` on are not.
    let (mut lo, mut len) = (0, entries.len());
    while len > 0 {
        let half = len / 2;
        let mid = lo + half;
        if let Some(e) = entries.get(lo + half / 2) {
            layout::prefetch(e);
        }
        if let Some(e) = entries.get(mid + 1 + (len - half - 1) / 2) {
            layout::prefetch(e);
        }
        if entries[mid].key.cmp_probe(key) == Ordering::Greater {
            len = half;
        } else {
            lo = mid + 1;
            len -= half + 1;
        }
    }
    lo.saturating_sub(1)
}

/// Point lookup: runs `f` on the value of `key`, if present, without copying it.
pub(crate) fn get_with<R>(
    loader: Loader<'_>,
    root: Option<&Child>,
    key: &[u8],
    f: impl FnOnce(ValueRef<'_>) -> Result<R>,
) -> Result<Option<R>> {
    let Some(root) = root else { return Ok(None) };
    match root {
        Child::Mem(node) => get_below(loader, node, key, f, 0),
        Child::Disk(r) => get_below(loader, &*loader.load(*r)?, key, f, 0),
    }
}

/// One level of a point lookup. In-memory children are followed by reference (no
/// reference-count traffic); written ones are held while their subtree is searched.
fn get_below<R>(
    loader: Loader<'_>,
    node: &Node,
    key: &[u8],
    f: impl FnOnce(ValueRef<'_>) -> Result<R>,
    depth: usize,
) -> Result<Option<R>> {
    if depth > MAX_DEPTH {
        return Err(Error::corrupted("node", "tree deeper than MAX_DEPTH"));
    }
    if node.is_leaf() {
        return match node.search(key) {
            Ok(i) => f(node.value(i)).map(Some),
            Err(_) => Ok(None),
        };
    }
    if node.len() == 0 {
        return Err(Error::corrupted("node", "branch node without children"));
    }
    let i = node.child_index(key);
    match node.mem_child(i) {
        Some(c) if c.level + 1 == node.level => get_below(loader, c, key, f, depth + 1),
        _ => get_below(loader, &*loader.child_at(node, i)?, key, f, depth + 1),
    }
}

/// Whether `key` is present.
pub(crate) fn contains(loader: Loader<'_>, root: Option<&Child>, key: &[u8]) -> Result<bool> {
    Ok(get_with(loader, root, key, |_| Ok(()))?.is_some())
}

#[cfg(test)]
mod tests {
    use super::leaf::LeafBuf;
    use super::*;
    use crate::format::SegmentId;

    /// A node read ahead is cached on its own checksum; a load through a pointer
    /// whose checksum or length disagrees is refused as corruption, as a read would
    /// be, and one through the right pointer is served from the cache.
    #[test]
    fn a_node_read_ahead_must_match_the_pointer_that_loads_it() {
        let vfs = Arc::new(crate::io::sim::SimVfs::new());
        let segments = Segments::open(vfs, false).expect("segments on a fresh SimVfs");
        let cache = PageCache::new(1 << 20);
        let loader = Loader {
            cache: &cache,
            segments: &segments,
        };
        let leaf = Node::new_leaf(
            LeafBuf::from_entries([(&b"k"[..], ValueRef::Inline(b"v"))]),
            1,
        );
        let mut bytes = Vec::new();
        leaf.encode(&mut bytes);
        let addr = Addr::new(SegmentId(1), 64);
        let right = BlockRef {
            addr,
            len: len_u32(bytes.len()),
            crc: crc(&bytes),
        };

        let mut damaged = bytes.clone();
        damaged[12] ^= 1;
        assert!(
            !loader.cache_read_ahead(addr, &damaged),
            "a node failing its own checksum is not cached"
        );
        assert!(loader.cache_read_ahead(addr, &bytes));

        let wrong_crc = BlockRef {
            crc: right.crc ^ 1,
            ..right
        };
        let wrong_len = BlockRef {
            len: right.len + 1,
            ..right
        };
        for bad in [wrong_crc, wrong_len] {
            let err = loader.load(bad).expect_err("the pointer disagrees");
            assert!(err.is_corruption(), "{err}");
        }
        let node = loader.load(right).expect("served from the cache");
        assert_eq!(node.level, 0);
    }

    /// The writer's branch search (prefetching) finds what `partition_point` finds:
    /// the last entry `<= key`, or the first, for every probe between, on, below and
    /// above the keys of branches of every size up to a full one.
    #[test]
    fn child_index_is_the_last_entry_at_or_below_the_key() {
        use crate::io::sim::SplitMix;
        let mut rng = SplitMix(7);
        for n in 0..=170usize {
            let mut keys: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = 1 + rng.below(12) as usize;
                    (0..len)
                        .map(|_| b"ab\x00\xff"[rng.below(4) as usize])
                        .collect()
                })
                .collect();
            keys.sort();
            keys.dedup();
            let entries: Vec<BranchEntry> = keys
                .iter()
                .map(|k| BranchEntry {
                    key: node::Key::from(&k[..]),
                    child: Child::Disk(BlockRef {
                        addr: Addr(1),
                        len: 1,
                        crc: 0,
                    }),
                })
                .collect();
            let mut probes: Vec<Vec<u8>> = keys.clone();
            for _ in 0..40 {
                let len = rng.below(13) as usize;
                probes.push(
                    (0..len)
                        .map(|_| b"ab\x00\xff"[rng.below(4) as usize])
                        .collect(),
                );
            }
            for p in &probes {
                let want = keys
                    .partition_point(|k| k.as_slice() <= p.as_slice())
                    .saturating_sub(1);
                assert_eq!(
                    child_index(&entries, &Probe::new(p)),
                    want,
                    "{n} keys, probe {p:?}"
                );
            }
        }
    }
}
