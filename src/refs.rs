//! "Who references this block?": the live blocks of a segment, each with the parent
//! nodes that point at it, the key it sits under, and the versions that reach it
//! (expanded upwards through shared parents to every root, Backlog §4.2.2).
//!
//! The answer comes from an index of parent edges. `walk_index` builds one from a
//! full walk of every version; `verify` compares it with the back-reference store.

use crate::btree::node::{Body, Node, Value};
use crate::btree::walk::{walk, At, Visitor};
use crate::engine::Shared;
use crate::error::Result;
use crate::format::{Addr, AddrMap, BlockRef, SegmentId};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What kind of block an address holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockKind {
    /// A leaf node.
    Leaf,
    /// A branch (interior) node.
    Branch,
    /// An out-of-line value.
    Value,
}

impl std::fmt::Display for BlockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BlockKind::Leaf => "leaf",
            BlockKind::Branch => "branch",
            BlockKind::Value => "value",
        })
    }
}

/// Where a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct BlockAddress {
    /// Segment number.
    pub segment: u32,
    /// Byte offset in the segment file.
    pub offset: u64,
}

impl From<Addr> for BlockAddress {
    fn from(a: Addr) -> Self {
        BlockAddress {
            segment: a.segment().0,
            offset: a.offset(),
        }
    }
}

/// One live block and who references it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockRefs {
    /// Segment number.
    pub segment: u32,
    /// Byte offset in the segment file.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// Leaf, branch or value.
    pub kind: BlockKind,
    /// The key it sits under: a value's key; for a node, the separator its parent
    /// files it under (for a root, its first key).
    pub key: Vec<u8>,
    /// The nodes that point at it (none for a version's root).
    pub parents: Vec<BlockAddress>,
    /// The versions that reach it, through any path.
    pub versions: Vec<String>,
}

/// One live block as the index knows it.
#[derive(Clone, Debug)]
pub(crate) struct BlockInfo {
    pub len: u32,
    pub kind: BlockKind,
    pub key: Vec<u8>,
}

/// Parent edges of every written block reachable from the versions.
#[derive(Default)]
pub(crate) struct Index {
    /// Child → the written nodes pointing at it.
    pub parents: AddrMap<Addr, Vec<Addr>>,
    /// Every reachable written block.
    pub blocks: BTreeMap<Addr, BlockInfo>,
    /// Root address → the versions whose root it is.
    pub roots: AddrMap<Addr, Vec<String>>,
}

impl Index {
    /// The live blocks of `segment`, each with its parents and versions.
    pub(crate) fn segment(&self, segment: SegmentId) -> Vec<BlockRefs> {
        let lo = Addr::new(segment, 0);
        let hi = Addr::new(SegmentId(segment.0.saturating_add(1)), 0);
        let mut memo: AddrMap<Addr, BTreeSet<String>> = AddrMap::default();
        let range = if segment.0 == u32::MAX {
            self.blocks.range(lo..)
        } else {
            self.blocks.range(lo..hi)
        };
        range
            .map(|(&addr, info)| {
                let mut parents: Vec<BlockAddress> = self
                    .parents
                    .get(&addr)
                    .map(|p| p.iter().map(|&a| a.into()).collect())
                    .unwrap_or_default();
                parents.sort();
                parents.dedup();
                BlockRefs {
                    segment: addr.segment().0,
                    offset: addr.offset(),
                    len: info.len,
                    kind: info.kind,
                    key: info.key.clone(),
                    parents,
                    versions: self.versions_of(addr, &mut memo).into_iter().collect(),
                }
            })
            .collect()
    }

    /// The versions reaching `addr`: its own if it is a root, plus those of every
    /// parent, recursively (memoised, so shared subtrees are expanded once).
    fn versions_of(
        &self,
        addr: Addr,
        memo: &mut AddrMap<Addr, BTreeSet<String>>,
    ) -> BTreeSet<String> {
        if let Some(v) = memo.get(&addr) {
            return v.clone();
        }
        // Parents sit at higher levels, so the recursion ends; an explicit stack
        // keeps a deep chain from using the thread's stack.
        let mut order = vec![addr];
        let mut stack = vec![addr];
        let mut seen = BTreeSet::from([addr]);
        while let Some(a) = stack.pop() {
            for &p in self.parents.get(&a).into_iter().flatten() {
                if !memo.contains_key(&p) && seen.insert(p) {
                    order.push(p);
                    stack.push(p);
                }
            }
        }
        // Resolve from the top down: sort by level is not known here, so iterate
        // until every address in `order` is resolved (each pass resolves at least
        // the ones whose parents are all resolved; the parent graph is acyclic).
        let mut pending = order;
        while !pending.is_empty() {
            let before = pending.len();
            pending.retain(|&a| {
                let parents = self.parents.get(&a).map(Vec::as_slice).unwrap_or(&[]);
                if parents.iter().any(|p| !memo.contains_key(p)) {
                    return true;
                }
                let mut set: BTreeSet<String> =
                    self.roots.get(&a).into_iter().flatten().cloned().collect();
                for p in parents {
                    if let Some(v) = memo.get(p) {
                        set.extend(v.iter().cloned());
                    }
                }
                memo.insert(a, set);
                false
            });
            if pending.len() == before {
                break; // a cycle: only damaged pointers could make one
            }
        }
        memo.get(&addr).cloned().unwrap_or_default()
    }
}

/// Builds the index from a walk of every version of the published view.
pub(crate) fn walk_index(shared: &Shared) -> Result<Index> {
    let view = shared.published();
    let mut builder = Builder {
        index: Index::default(),
        stack: Vec::new(),
        visited: BTreeSet::new(),
    };
    for v in view.versions.iter() {
        let Some(root) = &v.root else { continue };
        if let Some(r) = root.disk_ref() {
            builder
                .index
                .roots
                .entry(r.addr)
                .or_default()
                .push(v.name.to_string());
        }
        walk(&mut shared.loader(), root, &mut builder)?;
    }
    Ok(builder.index)
}

struct Builder {
    index: Index,
    /// The written nodes on the path from the root (`None` for an unwritten one).
    stack: Vec<Option<Addr>>,
    visited: BTreeSet<Addr>,
}

impl Builder {
    fn note(&mut self, r: BlockRef, kind: BlockKind, key: &[u8]) {
        if let Some(Some(parent)) = self.stack.last() {
            self.index.parents.entry(r.addr).or_default().push(*parent);
        }
        self.index
            .blocks
            .entry(r.addr)
            .or_insert_with(|| BlockInfo {
                len: r.len,
                kind,
                key: key.to_vec(),
            });
    }
}

impl Visitor for Builder {
    fn enter(&mut self, at: &At<'_>) -> Result<bool> {
        let Some(r) = at.child.disk_ref() else {
            return Ok(true);
        };
        if self.visited.contains(&r.addr) {
            // A shared subtree seen before: only this new edge is recorded.
            if let Some(Some(parent)) = self.stack.last() {
                self.index.parents.entry(r.addr).or_default().push(*parent);
            }
            return Ok(false);
        }
        Ok(true)
    }

    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        let r = at.child.disk_ref();
        if let Some(r) = r {
            self.visited.insert(r.addr);
            let kind = if node.level == 0 {
                BlockKind::Leaf
            } else {
                BlockKind::Branch
            };
            let key = at.lo.or(node.first_key()).unwrap_or_default().to_vec();
            self.note(r, kind, &key);
        }
        if let (Some(r), Body::Leaf(entries)) = (r, &node.body) {
            for e in entries {
                if let Value::Extent(x) = e.value {
                    self.index.parents.entry(x.addr).or_default().push(r.addr);
                    self.index
                        .blocks
                        .entry(x.addr)
                        .or_insert_with(|| BlockInfo {
                            len: x.len,
                            kind: BlockKind::Value,
                            key: e.key.to_vec(),
                        });
                }
            }
        }
        self.stack.push(r.map(|r| r.addr));
        Ok(true)
    }

    fn leave(&mut self, _at: &At<'_>, _node: &Arc<Node>) -> Result<()> {
        self.stack.pop();
        Ok(())
    }
}
