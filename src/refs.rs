//! "Who references this block?": the live blocks of a segment, each with the parent
//! nodes that point at it, the key it sits under, and the versions that reach it
//! (expanded upwards through shared parents to every root, Backlog §4.2.2).
//!
//! The answer comes from the back references (`crate::backref`), which `verify`
//! checks against a full walk.

use crate::btree::node::Node;
use crate::btree::walk::{walk, At, Visitor};
use crate::engine::Shared;
use crate::error::Result;
use crate::format::{Addr, BlockRef, SegmentId};
use crate::sync::lock;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, TryLockError};

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

/// The live blocks of `segment` and who references them. The back references give
/// each block's parents and, upwards from them, every node on a path from a root to
/// the segment (the closure); each version is then walked only through that closure,
/// which names the versions reaching each block, its kind and its key. The cost
/// follows the answer, not the store. (The walk sees the writer's current trees;
/// back references name written parents, so blocks reachable only through nodes not
/// yet checkpointed are listed without parents.)
///
/// The back references are the store's runs, those a checkpoint put off by a full
/// disk left for the next one (`Durable::carried`), and the writer's since; a
/// checkpoint writing holds the ones it froze, so this waits until none is.
pub(crate) fn segment_refs(shared: &Shared, segment: SegmentId) -> Result<Vec<BlockRefs>> {
    // A segment that is not there (any id a user may type, some past what an
    // address can hold) has no blocks.
    if !shared.segments.contains(segment) {
        return Ok(Vec::new());
    }
    let lo = Addr::new(segment, 0);
    // (`Addr(u64::MAX)`, the end of the last id, marks a deleted segment's records.)
    let hi = Addr::end_of(segment);
    let in_segment = |a: Addr| a.segment() == segment;
    // The view keeps every block these trees reach from being deleted while the
    // walk below reads them (a clean may relocate them meanwhile).
    let (_view, catalog, ws) = loop {
        let w = shared.lock_writer();
        // (The writer lock comes first for a checkpoint's freeze too: only a try here.)
        let durable = match shared.durable.try_lock() {
            Ok(durable) => durable,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // A checkpoint is writing: its back references are in neither place
                // until it is done.
                drop(w);
                drop(lock(&shared.durable));
                continue;
            }
        };
        let mut ws = (durable.carried.as_ref())
            .map(|carried| carried.backrefs.clone())
            .unwrap_or_default();
        drop(durable);
        ws.merge(w.backrefs.clone());
        break (shared.hold_space(&w), w.catalog.clone(), ws);
    };
    let mut parents: BTreeMap<Addr, BTreeSet<Addr>> = BTreeMap::new();
    let mut closure: BTreeSet<Addr> = BTreeSet::new();
    {
        let store = lock(&shared.backrefs);
        let mut todo: Vec<Addr> = Vec::new();
        let edges = store.edges(lo..hi, &ws);
        for e in edges {
            parents.entry(e.child).or_default().insert(e.parent);
            closure.insert(e.child);
            todo.push(e.parent);
        }
        while let Some(a) = todo.pop() {
            if closure.insert(a) {
                todo.extend(store.parents(a, &ws));
            }
        }
    }
    let mut finder = Finder {
        closure: &closure,
        in_segment: &in_segment,
        version: String::new(),
        seen: BTreeSet::new(),
        found: BTreeMap::new(),
        unwritten: Vec::new(),
    };
    for v in &catalog.versions {
        let Some(root) = &v.root else { continue };
        // A root in the segment has no parent edge: it joins the closure here.
        // A written root outside the closure reaches nothing in the segment; an
        // unwritten one may, through pointers the back references do not know yet.
        let reaches = root
            .disk_ref()
            .is_none_or(|r| in_segment(r.addr) || closure.contains(&r.addr));
        if !reaches {
            continue;
        }
        finder.version = v.name.to_string();
        finder.seen.clear();
        walk(&mut shared.loader(), root, &mut finder)?;
    }
    Ok(finder
        .found
        .into_iter()
        .map(|(addr, (len, kind, key, versions))| BlockRefs {
            segment: addr.segment().0,
            offset: addr.offset(),
            len,
            kind,
            key,
            parents: parents
                .get(&addr)
                .map(|p| p.iter().map(|&a| a.into()).collect())
                .unwrap_or_default(),
            versions: versions.into_iter().collect(),
        })
        .collect())
}

/// A found block: length, kind, key and the versions reaching it.
type Found = (u32, BlockKind, Vec<u8>, BTreeSet<String>);

/// Walks one version through the closure, noting the blocks of the segment it meets.
struct Finder<'a> {
    closure: &'a BTreeSet<Addr>,
    in_segment: &'a dyn Fn(Addr) -> bool,
    version: String,
    /// Nodes this version's walk has entered (a version is a tree: each once).
    seen: BTreeSet<Addr>,
    found: BTreeMap<Addr, Found>,
    /// Per node on the current path: whether it is unwritten (its pointers are not
    /// back references yet).
    unwritten: Vec<bool>,
}

impl Finder<'_> {
    fn note(&mut self, r: BlockRef, kind: BlockKind, key: &[u8]) {
        let entry = self
            .found
            .entry(r.addr)
            .or_insert_with(|| (r.len, kind, key.to_vec(), BTreeSet::new()));
        entry.3.insert(self.version.clone());
    }
}

impl Visitor for Finder<'_> {
    fn enter(&mut self, at: &At<'_>) -> Result<bool> {
        let under_unwritten = self.unwritten.last() == Some(&true);
        Ok(match at.child.disk_ref() {
            Some(r) => {
                // A block whose parent is not written yet has no back reference from
                // it: met here, it is listed (without that parent).
                let wanted = at.depth == 0
                    || self.closure.contains(&r.addr)
                    || (under_unwritten && (self.in_segment)(r.addr));
                wanted && self.seen.insert(r.addr)
            }
            // An unwritten node: the paths below it are unknown to the back
            // references, so it is walked.
            None => true,
        })
    }

    fn leave(&mut self, _at: &At<'_>, _node: &Arc<Node>) -> Result<()> {
        self.unwritten.pop();
        Ok(())
    }

    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        self.unwritten.push(at.child.disk_ref().is_none());
        if let Some(r) = at.child.disk_ref().filter(|r| (self.in_segment)(r.addr)) {
            let kind = if node.level == 0 {
                BlockKind::Leaf
            } else {
                BlockKind::Branch
            };
            let key = at.lo.or(node.first_key()).unwrap_or_default().to_vec();
            self.note(r, kind, &key);
        }
        for (key, x) in node.extents() {
            if (self.in_segment)(x.addr) {
                self.note(x, BlockKind::Value, key);
            }
        }
        Ok(true)
    }
}
