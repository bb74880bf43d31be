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
//! A transaction changes these tables as its edits go, under the writer lock it holds
//! throughout, and remembers each change in a [`CountUndo`], which an abort replays
//! backwards (its `SpaceDelta`, by contrast, is only folded in at commit). The
//! cleaner and version drops collect an [`RcDelta`] instead and apply it whole.
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
#[derive(Default)]
pub(crate) struct RefCounts {
    /// Written blocks (nodes and extents) with a count above one, by address.
    pub table: CountTable,
    /// Unmerged in-memory nodes with a count above one.
    mem: AddrMap<NodeId, (Arc<Node>, u32)>,
    /// Nodes made dirty in this epoch or earlier are written and merged: their
    /// counts are in `table`.
    pub merged_through: u64,
    /// Every change to a `table` entry since the last [`RefCounts::take_changes`], in
    /// order, with the count it left (1: the entry is gone): what the next
    /// checkpoint's metadata delta records (a checkpoint writes only what changed,
    /// never the whole table). Kept as changes happen, so that a freeze takes it
    /// whole instead of looking every address up under the writer lock (a volume
    /// with snapshots changes hundreds of thousands of extent counts per interval).
    changed: ChangeLog,
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
        let mut counts = CountTable::default();
        for (addr, count) in table {
            counts.set(addr, count);
        }
        RefCounts {
            table: counts,
            mem: AddrMap::default(),
            merged_through: 0,
            changed: ChangeLog::default(),
        }
    }

    /// A copy of the counts, without the record of changes a checkpoint takes (for
    /// readers of the counts outside the writer lock: the copy is made under it).
    pub(crate) fn counts(&self) -> RefCounts {
        RefCounts {
            table: self.table.clone(),
            mem: self.mem.clone(),
            merged_through: self.merged_through,
            changed: ChangeLog::default(),
        }
    }

    /// Marks `addr`'s entry as changed, so the next checkpoint records its count
    /// (for an address a checkpoint recorded from an in-memory entry whose count may
    /// have changed, or gone, before it was merged into the table).
    pub(crate) fn mark_changed(&mut self, addr: Addr) {
        let count = self.table.get(addr);
        self.changed.push(addr, count);
    }

    /// Every change to an entry since the last call, in order, with the count it left
    /// (a count of one or less means the entry is gone; where an address appears more
    /// than once, its last count is its count now); resets the record. Constant time:
    /// the record is handed over whole.
    pub(crate) fn take_changes(&mut self) -> ChangeLog {
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

    /// The count of `t` (one when it has no entry).
    pub(crate) fn count(&self, t: &Target<'_>) -> u32 {
        match t {
            Target::Block(r) => self.table.get(r.addr),
            Target::Mem(n) => self.mem.get(&node_id(n)).map_or(1, |e| e.1),
        }
    }

    /// Folds the counts of in-memory nodes written by checkpoints of epochs up to
    /// `epoch` into the table, by their new addresses. Only call when no checkpoint
    /// of those epochs is still writing, and never while a transaction holds an
    /// [`RcDelta`] computed before the fold: its in-memory entries for folded nodes
    /// would never be folded (the count `set` here assumes the address has no entry
    /// yet, which holds because a written node's address is new and nothing names it
    /// by address before this fold).
    pub(crate) fn merge_written(&mut self, epoch: u64) {
        if epoch <= self.merged_through {
            return;
        }
        let table = &mut self.table;
        let changed = &mut self.changed;
        self.mem.retain(|_, (n, count)| match n.disk.get() {
            Some(r) if n.epoch <= epoch => {
                table.set(r.addr, *count);
                changed.push(r.addr, *count);
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

    /// Adds `d` to the count of `t`, at once (a transaction's changes, as it makes
    /// them; `undo` remembers each, so an abort can take them back).
    pub(crate) fn add(&mut self, t: &Target<'_>, d: i64, undo: &mut CountUndo) {
        let changed = match t {
            Target::Block(r) => {
                self.add_block(r.addr, d);
                UndoTarget::Block(r.addr)
            }
            Target::Mem(n) => {
                self.add_mem(node_id(n), || Arc::clone(n), d);
                UndoTarget::Mem(Arc::clone(n))
            }
        };
        undo.changes.push((changed, d));
    }

    /// Takes back the changes `undo` remembers, newest first: the counts are as they
    /// were before the aborted transaction made them.
    pub(crate) fn revert(&mut self, undo: CountUndo) {
        for (t, d) in undo.changes.into_iter().rev() {
            match t {
                UndoTarget::Block(addr) => self.add_block(addr, -d),
                UndoTarget::Mem(n) => self.add_mem(node_id(&n), || n, -d),
            }
        }
    }

    /// Applies a delta collected apart from the counts (the cleaner's, a drop's).
    pub(crate) fn apply(&mut self, delta: RcDelta) {
        for (addr, d) in delta.blocks {
            self.add_block(addr, d);
        }
        for (id, (node, d)) in delta.mem {
            self.add_mem(id, || node, d);
        }
    }

    fn add_block(&mut self, addr: Addr, d: i64) {
        let now = self.table.add(addr, d);
        self.changed.push(addr, now);
    }

    /// Adds `d` to the count of the in-memory node `id` (`node` gives the `Arc` an
    /// entry it creates holds).
    fn add_mem(&mut self, id: NodeId, node: impl FnOnce() -> Arc<Node>, d: i64) {
        let entry = self.mem.get_mut(&id);
        let now = i64::from(entry.as_ref().map_or(1, |e| e.1)) + d;
        assert!(
            now >= 0,
            "reference count of an in-memory node below zero ({now})"
        );
        match (u32::try_from(now), entry) {
            (Ok(n), Some(e)) if n > 1 => e.1 = n,
            (Ok(n), None) if n > 1 => {
                self.mem.insert(id, (node(), n));
            }
            (_, Some(_)) => {
                self.mem.remove(&id);
            }
            (_, None) => {}
        }
    }

    /// Blocks and in-memory nodes with a count above one (for `stats`).
    pub(crate) fn shared_blocks(&self) -> usize {
        self.table.len() + self.mem.len()
    }
}

/// Shards of [`CountTable`]: a power of two.
const COUNT_SHARDS: usize = 64;

/// Counts above one by address, split over [`COUNT_SHARDS`] hash maps by a hash of
/// the address. A hash map grows by moving every entry it holds into a table twice
/// the size, and this one grows under the writer lock, inside a commit: one map,
/// growing past ~230k entries (the extents of a snapshotted 1 GiB volume, whose
/// leaves its writes copied), held the lock for 5.6 ms, and the next growth would
/// take twice that; a snapshot asked for meanwhile waits as long. Split, a shard
/// grows by moving a sixty-fourth of them.
///
/// A copy shares the shards until one is written: `volume list` copies the counts
/// under the writer lock to fold them outside it, and a whole table (~4 MB at 260k
/// entries) copied there held every writer meanwhile; now the copy is 64 reference
/// bumps, and each shard a writer then changes is copied once, by that writer.
#[derive(Clone)]
pub(crate) struct CountTable {
    shards: Box<[Arc<AddrMap<Addr, u32>>]>,
    len: usize,
}

impl Default for CountTable {
    fn default() -> CountTable {
        CountTable {
            shards: (0..COUNT_SHARDS).map(|_| Arc::default()).collect(),
            len: 0,
        }
    }
}

impl CountTable {
    /// The shard of `addr`: the top bits of a hash the shards' maps do not use (their
    /// own hash of the address picks the bucket, so within a shard it stays uniform).
    fn shard(addr: Addr) -> usize {
        let h = (addr.0 ^ 0x6a09_e667_f3bc_c908).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - COUNT_SHARDS.trailing_zeros())) as usize
    }

    /// The count of `addr` (one when it has no entry).
    pub(crate) fn get(&self, addr: Addr) -> u32 {
        self.shards[Self::shard(addr)]
            .get(&addr)
            .copied()
            .unwrap_or(1)
    }

    /// Sets the count of `addr`; one or less removes its entry.
    pub(crate) fn set(&mut self, addr: Addr, count: u32) {
        let shard = Arc::make_mut(&mut self.shards[Self::shard(addr)]);
        let before = shard.len();
        if count > 1 {
            shard.insert(addr, count);
        } else {
            shard.remove(&addr);
        }
        self.len = self.len + shard.len() - before;
    }

    /// Adds `d` to the count of `addr`; returns the count it leaves, one for an address
    /// left with no entry (a count of one is implicit; zero means the block is free,
    /// which its owner records elsewhere).
    pub(crate) fn add(&mut self, addr: Addr, d: i64) -> u32 {
        let slot = &mut self.shards[Self::shard(addr)];
        let had = slot.get(&addr).copied();
        let now = i64::from(had.unwrap_or(1)) + d;
        // Below zero, a block would be freed while something still points at it: the
        // counts no longer describe the trees. Stop here (the writer lock's poisoning
        // then makes the store refuse writes) rather than go on to free live data.
        assert!(now >= 0, "reference count of {addr:?} below zero ({now})");
        match u32::try_from(now) {
            Ok(n) if n > 1 => {
                // (Only an insert may grow the map: a count falling to one, or
                // to zero from no entry, never does.)
                if Arc::make_mut(slot).insert(addr, n).is_none() {
                    self.len += 1;
                }
                n
            }
            _ => {
                if had.is_some() {
                    Arc::make_mut(slot).remove(&addr);
                    self.len -= 1;
                }
                1
            }
        }
    }

    /// Entries (counts above one).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Entries of a [`ChangeLog`] chunk: 1 MiB of them.
const CHANGE_CHUNK: usize = 1 << 16;

/// Changes to counts in the order they happened, each the address and the count it
/// left. Appending is a write to the end of a chunk, never a hash-table probe or a
/// move of what is there: a leaf copied after a snapshot changes the count of each of
/// its few hundred extents, and the map of changed addresses this replaces, emptied
/// at every freeze and grown again under the writer lock, once held it for 43 ms
/// growing past ~360k entries. The price: an address changed twice is recorded
/// twice, until the next freeze. 16 bytes a change: a leaf copied after a snapshot
/// (8 KiB dirty) logs up to ~4.8 KiB, so the log stays below the dirty nodes that
/// trigger the next checkpoint; the walk of a dropped version (`drop_step`) logs
/// without dirtying anything, as the map did at twice the bytes an entry.
#[derive(Default)]
pub(crate) struct ChangeLog {
    chunks: Vec<Vec<(Addr, u32)>>,
}

impl ChangeLog {
    fn push(&mut self, addr: Addr, count: u32) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHANGE_CHUNK => chunk.push((addr, count)),
            _ => {
                // The first chunk of an interval grows as it fills (a small store's
                // interval changes a few counts); later ones are made whole.
                let mut chunk = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHANGE_CHUNK)
                };
                chunk.push((addr, count));
                self.chunks.push(chunk);
            }
        }
    }

    /// Puts `earlier`'s changes before this log's (a put-off checkpoint's, taken
    /// back by the next one).
    pub(crate) fn after(&mut self, earlier: ChangeLog) {
        let later = std::mem::replace(&mut self.chunks, earlier.chunks);
        self.chunks.extend(later);
    }

    /// Every change, oldest first, leaving the log as it is (a checkpoint put off
    /// after it planned its metadata still has it to carry).
    pub(crate) fn iter_ordered(&self) -> impl Iterator<Item = (Addr, u32)> + '_ {
        self.chunks.iter().flatten().copied()
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
        let now = i64::from(base.count(t)) + d;
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

/// What a count a transaction changed at once was changed by, newest last: what an
/// abort takes back ([`RefCounts::revert`]). Applying a transaction's count changes
/// as it makes them, rather than collecting them and applying them at its commit,
/// keeps the commit short: a batch of volume writes just after a snapshot copies
/// shared leaves and adds a parent to each of their hundreds of extents, several
/// thousand changes that a snapshot asked for meanwhile would wait for at the
/// commit; made as the writes go, a batch can stop between writes and let it in.
#[derive(Default)]
pub(crate) struct CountUndo {
    changes: Vec<(UndoTarget, i64)>,
}

enum UndoTarget {
    Block(Addr),
    /// Held, as the counts' own entry holds it, so its identity is not reused.
    Mem(Arc<Node>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// xorshift64: deterministic and dependency-free.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn count_table_matches_a_map_of_counts_above_one() {
        let mut table = CountTable::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1d;
        for step in 0..200_000 {
            // 4 KiB-aligned addresses, as extents have, over a small range so that
            // counts rise, fall and come back.
            let addr = (next(&mut x) % 5_000) << 12;
            let have = model.get(&addr).copied().unwrap_or(1);
            if step % 7 == 0 {
                let count = (next(&mut x) % 4) as u32;
                table.set(Addr(addr), count);
                if count > 1 {
                    model.insert(addr, count);
                } else {
                    model.remove(&addr);
                }
            } else {
                // Down only from a count above one (the writer frees a block at one).
                let d = if have > 1 && next(&mut x).is_multiple_of(2) {
                    -1
                } else {
                    1
                };
                let now = table.add(Addr(addr), d);
                let want = i64::from(have) + d;
                assert_eq!(i64::from(now), want.max(1), "step {step}");
                if want > 1 {
                    model.insert(addr, want as u32);
                } else {
                    model.remove(&addr);
                }
            }
            assert_eq!(
                table.get(Addr(addr)),
                model.get(&addr).copied().unwrap_or(1)
            );
        }
        assert_eq!(table.len(), model.len());
        for (addr, count) in &model {
            assert_eq!(table.get(Addr(*addr)), *count);
        }
        // Every shard is used: the shard hash spreads aligned addresses.
        assert!(table.shards.iter().all(|s| !s.is_empty()));
    }

    #[test]
    fn a_copy_of_the_counts_keeps_them_as_they_were() {
        let mut table = CountTable::default();
        for a in 0..10_000u64 {
            table.set(Addr(a << 12), 2);
        }
        let copy = table.clone();
        for a in 0..10_000u64 {
            table.add(Addr(a << 12), if a % 2 == 0 { 1 } else { -1 });
        }
        table.set(Addr(1 << 40), 5);
        for a in 0..10_000u64 {
            assert_eq!(copy.get(Addr(a << 12)), 2);
            assert_eq!(table.get(Addr(a << 12)), if a % 2 == 0 { 3 } else { 1 });
        }
        assert_eq!((copy.len(), table.len()), (10_000, 5_001));
        assert_eq!(copy.get(Addr(1 << 40)), 1);
    }

    #[test]
    fn a_change_log_replays_to_the_last_count_of_each_address() {
        let mut log = ChangeLog::default();
        let mut last: BTreeMap<Addr, u32> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15;
        // Past two chunks, so order across chunk boundaries counts.
        for _ in 0..(2 * CHANGE_CHUNK + 1_000) {
            let addr = Addr(next(&mut x) % 10_000);
            let count = (next(&mut x) % 5) as u32;
            log.push(addr, count);
            last.insert(addr, count);
        }
        assert_eq!(log.chunks.len(), 3);
        let replayed: BTreeMap<Addr, u32> = log.iter_ordered().collect();
        assert_eq!(replayed, last);
    }

    #[test]
    #[should_panic(expected = "below zero")]
    fn a_count_taken_below_zero_stops_the_writer() {
        let mut table = CountTable::default();
        table.add(Addr(4096), -2);
    }
}
