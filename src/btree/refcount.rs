//! Lazy reference counts (Rodeh §5.3): how many parents point at a node or a value
//! extent, so versions can share subtrees.
//!
//! A block's count is the number of pointers to it from *nodes* (and version roots),
//! not from versions: a node shared by a thousand snapshots through one parent has a
//! count of one. That is what makes a clone O(1) (only the root's count changes) and
//! what makes the counts lazy: when a writer shadows a node whose count is above one,
//! the copy is a new parent of every child, so each child's count goes up by one and
//! the old node's goes down by one (`btree::write::shadow`); a node with a count of
//! one is simply replaced, and its own space freed. A count of one is implicit: only
//! counts above one are stored.
//!
//! Where a count lives depends on where the node is:
//! - written nodes and value extents: `table`, by address;
//! - nodes in memory that a checkpoint has not yet written, or wrote but whose results
//!   the writer has not yet folded in: `mem`, by node identity. "Folded in" means
//!   `merge_written` moved the entry to `table` by the node's new address; it runs at
//!   the next freeze (or right after the checkpoint, if the writer lock is free), and
//!   until then a copy keeps such a child as an in-memory pointer (never by address),
//!   so the address is not used as a key before it has an entry.
//!
//! Writers never change these tables directly: a transaction collects an [`RcDelta`]
//! (aborting drops it) and the commit applies it, just like its `SpaceDelta`.
//!
//! Invariant (checked by `verify` from a walk of every version): for every block
//! reachable from a version root or from the drop queue, the stored count equals the
//! number of distinct reachable nodes (plus roots) that point at it.

use crate::btree::node::{Child, ChildRef, Node};
use crate::format::AddrMap;
use crate::format::{Addr, BlockRef};
use std::sync::Arc;

/// Identity of an in-memory node (its address in memory; the map holds an `Arc`
/// to it, so the address is not reused while the entry exists).
type NodeId = usize;

fn node_id(n: &Arc<Node>) -> NodeId {
    Arc::as_ptr(n) as NodeId
}

/// The writer's reference counts above one.
#[derive(Default, Clone)]
pub(crate) struct RefCounts {
    /// Written blocks (nodes and extents) with a count above one, by address.
    pub table: AddrMap<Addr, u32>,
    /// Unmerged in-memory nodes with a count above one.
    mem: AddrMap<NodeId, (Arc<Node>, u32)>,
    /// Nodes made dirty in this epoch or earlier are written and merged: their
    /// counts are in `table`.
    pub merged_through: u64,
    /// Addresses whose `table` entry changed since the last [`RefCounts::take_changes`],
    /// with their count now (1: the entry is gone): what the next checkpoint's
    /// metadata delta records (a checkpoint writes only what changed, never the
    /// whole table). Kept current as counts change, so that a freeze takes it
    /// whole instead of looking every address up under the writer lock (a volume
    /// with snapshots changes hundreds of thousands of extent counts per interval).
    changed: AddrMap<Addr, u32>,
}

/// What a pointer points at, which decides where its count lives.
pub(crate) enum Target<'a> {
    /// A written, merged node, or a value extent.
    Block(BlockRef),
    /// An in-memory node whose count is not yet in the table.
    Mem(&'a Arc<Node>),
}

impl RefCounts {
    /// Counts loaded from a checkpoint's metadata.
    pub(crate) fn from_table(table: impl IntoIterator<Item = (Addr, u32)>) -> RefCounts {
        RefCounts {
            table: table.into_iter().collect(),
            mem: AddrMap::default(),
            merged_through: 0,
            changed: AddrMap::default(),
        }
    }

    /// Marks `addr`'s entry as changed, so the next checkpoint records its count
    /// (for an address a checkpoint recorded from an in-memory entry whose count may
    /// have changed, or gone, before it was merged into the table).
    pub(crate) fn mark_changed(&mut self, addr: Addr) {
        let count = self.table.get(&addr).copied().unwrap_or(1);
        self.changed.insert(addr, count);
    }

    /// The current count of every address whose entry changed since the last call
    /// (a count of one or less means the entry is gone); resets the record. Constant
    /// time: the record is handed over whole.
    pub(crate) fn take_changes(&mut self) -> AddrMap<Addr, u32> {
        std::mem::take(&mut self.changed)
    }

    /// Whether an in-memory node's count is still kept by identity.
    pub(crate) fn is_unmerged(&self, n: &Node) -> bool {
        n.disk.get().is_none() || n.epoch > self.merged_through
    }

    pub(crate) fn target<'c>(&self, child: &'c Child) -> Target<'c> {
        self.target_ref(child.as_ref())
    }

    /// [`RefCounts::target`] of a child as a reader sees it.
    pub(crate) fn target_ref<'c>(&self, child: ChildRef<'c>) -> Target<'c> {
        match child {
            ChildRef::Disk(r) => Target::Block(r),
            ChildRef::Mem(n) => match n.disk.get() {
                Some(r) if !self.is_unmerged(n) => Target::Block(*r),
                _ => Target::Mem(n),
            },
        }
    }

    fn base(&self, t: &Target<'_>) -> u32 {
        match t {
            Target::Block(r) => self.table.get(&r.addr).copied().unwrap_or(1),
            Target::Mem(n) => self.mem.get(&node_id(n)).map_or(1, |e| e.1),
        }
    }

    /// Folds the counts of in-memory nodes written by checkpoints of epochs up to
    /// `epoch` into the table, by their new addresses. Only call when no checkpoint
    /// of those epochs is still writing.
    pub(crate) fn merge_written(&mut self, epoch: u64) {
        if epoch <= self.merged_through {
            return;
        }
        let table = &mut self.table;
        let changed = &mut self.changed;
        self.mem.retain(|_, (n, count)| match n.disk.get() {
            Some(r) if n.epoch <= epoch => {
                table.insert(r.addr, *count);
                changed.insert(r.addr, *count);
                false
            }
            _ => true,
        });
        self.merged_through = epoch;
    }

    /// The unmerged in-memory entries: what a freeze hands to its checkpoint, which
    /// records them by address once it has written the nodes.
    pub(crate) fn unmerged(&self) -> Vec<(Arc<Node>, u32)> {
        self.mem.values().cloned().collect()
    }

    /// Applies a committed transaction's changes.
    pub(crate) fn apply(&mut self, delta: RcDelta) {
        for (addr, d) in delta.blocks {
            let now = i64::from(self.table.get(&addr).copied().unwrap_or(1)) + d;
            // Below zero, a block would be freed while something still points at it:
            // the counts no longer describe the trees. Stop here (the writer lock's
            // poisoning then makes the store refuse writes) rather than go on to free
            // live data.
            assert!(now >= 0, "reference count of {addr:?} below zero ({now})");
            match u32::try_from(now) {
                Ok(n) if n > 1 => {
                    self.table.insert(addr, n);
                    self.changed.insert(addr, n);
                }
                _ => {
                    self.table.remove(&addr);
                    self.changed.insert(addr, 1);
                }
            }
        }
        for (id, (node, d)) in delta.mem {
            let now = i64::from(self.mem.get(&id).map_or(1, |e| e.1)) + d;
            assert!(
                now >= 0,
                "reference count of an in-memory node below zero ({now})"
            );
            match u32::try_from(now) {
                Ok(n) if n > 1 => {
                    self.mem.insert(id, (node, n));
                }
                _ => {
                    self.mem.remove(&id);
                }
            }
        }
    }

    /// Blocks and in-memory nodes with a count above one (for `stats`).
    pub(crate) fn shared_blocks(&self) -> usize {
        self.table.len() + self.mem.len()
    }
}

/// Count changes made by one transaction (or one step of a drop), not yet applied.
#[derive(Default)]
pub(crate) struct RcDelta {
    blocks: AddrMap<Addr, i64>,
    mem: AddrMap<NodeId, (Arc<Node>, i64)>,
}

impl RcDelta {
    /// The count of `t` with this delta applied on top of `base`.
    pub(crate) fn count(&self, base: &RefCounts, t: &Target<'_>) -> u32 {
        let d = match t {
            Target::Block(r) => self.blocks.get(&r.addr).copied().unwrap_or(0),
            Target::Mem(n) => self.mem.get(&node_id(n)).map_or(0, |e| e.1),
        };
        let now = i64::from(base.base(t)) + d;
        u32::try_from(now).unwrap_or(0)
    }

    pub(crate) fn add(&mut self, t: &Target<'_>, d: i64) {
        match t {
            Target::Block(r) => *self.blocks.entry(r.addr).or_default() += d,
            Target::Mem(n) => {
                self.mem
                    .entry(node_id(n))
                    .or_insert_with(|| (Arc::clone(n), 0))
                    .1 += d;
            }
        }
    }
}
