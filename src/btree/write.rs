//! Tree mutation: shadowing (mark-dirty), top-down insert with proactive splits, and
//! top-down delete with proactive fixes.
//!
//! Shadowing (Rodeh §4, mark-dirty §5.3) decides, for the node a writer is about to
//! change, whether it may be edited in place. First, sharing between versions: a node
//! whose reference count is above one (see `crate::btree::refcount`) is copied; the copy is
//! a new parent of every child (each child's count goes up by one) and the original
//! loses one parent. Otherwise the node belongs to this tree alone, and:
//! - dirty in the writer's epoch and referenced only by the writer's tree: in place;
//! - dirty but shared with a reader's view (the `Arc` has other holders): copy; the old
//!   one is never written (no checkpoint can reach it);
//! - dirty from the previous epoch (frozen: a checkpoint is writing it right now):
//!   copy, and remember the original, whose address is freed once it has one;
//! - clean (written): copy, and free the old address.
//!
//! In the single-owner cases the copy takes over the original's pointers, so no
//! child's count changes.

use super::leaf::{entry_size, LeafBuf};
use super::node::{
    branch_entry_size, Body, BranchEntry, Child, ChildRef, Key, Node, Probe, ValueRef, MERGE_MAX,
    NODE_MAX, NODE_MIN,
};
use super::{child_index, Loader};
use crate::backref::WriteStore;
use crate::btree::refcount::{CountUndo, RefCounts, Target};
use crate::error::Result;
use crate::format::BlockRef;
use crate::space::SpaceDelta;
use std::sync::Arc;

/// A value an insert replaced or a delete removed. Inline bytes went with their
/// entry; an extent loses a pointer, which the caller settles (`release_value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OldValue {
    Inline,
    Extent(BlockRef),
}

impl OldValue {
    fn of(value: ValueRef<'_>) -> OldValue {
        match value {
            ValueRef::Inline(_) => OldValue::Inline,
            ValueRef::Extent(r) => OldValue::Extent(r),
        }
    }
}

/// What a writer carries down the tree.
pub(crate) struct WriteCtx<'a> {
    pub loader: Loader<'a>,
    /// The writer's checkpoint epoch.
    pub epoch: u64,
    /// Live-byte changes made by this transaction.
    pub delta: &'a mut SpaceDelta,
    /// Frozen dirty nodes this transaction replaced or released; their addresses
    /// (assigned by the checkpoint in flight) are freed at the next freeze.
    pub superseded: &'a mut Vec<Arc<Node>>,
    /// Bytes of nodes this transaction made dirty.
    pub dirtied_bytes: &'a mut u64,
    /// Of those, bytes of copies of written nodes: memory holding entries that were
    /// on disk (the rest of a transaction's dirty memory is the entries it added).
    pub copied_written_bytes: &'a mut u64,
    /// The writer's reference counts, which an edit changes as it goes.
    pub refs: &'a mut RefCounts,
    /// Those changes, for an abort to take back.
    pub undo: &'a mut CountUndo,
    /// Back references this transaction ends: a written node it frees no longer
    /// points at its children.
    pub backrefs: &'a mut WriteStore,
    /// Written nodes this transaction copied while they were shared: their children
    /// gained a parent.
    pub unshared: &'a mut Vec<crate::format::Addr>,
}

impl WriteCtx<'_> {
    fn new_dirty(&mut self, node: Node) -> Child {
        *self.dirtied_bytes += node.size as u64;
        Child::Mem(Arc::new(node))
    }

    fn copy(&self, node: &Node) -> Node {
        node.dirty_copy(self.epoch, self.refs.merged_through)
    }

    fn count(&self, t: &Target<'_>) -> u32 {
        self.refs.count(t)
    }

    fn add_count(&mut self, t: &Target<'_>, d: i64) {
        self.refs.add(t, d, self.undo);
    }

    /// A copy of a shared node is one more parent of each of its children (and of
    /// each value extent, for a leaf).
    fn add_parent_to_children(&mut self, node: &Node) {
        for child in node.children() {
            let t = self.refs.target_ref(child);
            self.add_count(&t, 1);
        }
        for (_, r) in node.extents() {
            self.add_count(&Target::Block(r), 1);
        }
    }

    /// One pointer to a value goes away (the value was replaced or deleted): an
    /// extent no other leaf points at is freed.
    pub(crate) fn release_value(&mut self, value: ValueRef<'_>) {
        if let ValueRef::Extent(r) = value {
            let t = Target::Block(r);
            if self.count(&t) > 1 {
                self.add_count(&t, -1);
            } else {
                self.delta.free(r);
            }
        }
    }

    /// One pointer to a node goes away (its parent, or its version, was dropped:
    /// Rodeh §5.4). A node that still has other parents just loses one; one that had
    /// no other is unreferenced now, and so are, in turn, its children: in-memory
    /// nodes are released at once, down to the written ones; a written node goes onto
    /// `queue`, to be freed (and its children released) by `release_queued`, so a big
    /// drop proceeds in bounded steps.
    pub(crate) fn release_node(&mut self, child: ChildRef<'_>, queue: &mut Vec<BlockRef>) {
        let t = self.refs.target_ref(child);
        if self.count(&t) > 1 {
            self.add_count(&t, -1);
            return;
        }
        match t {
            Target::Block(r) => queue.push(r),
            Target::Mem(n) => {
                let n = Arc::clone(n);
                if n.disk.get().is_some() || n.epoch != self.epoch {
                    // Frozen: the checkpoint in flight writes it; free that address
                    // at the next freeze.
                    self.superseded.push(Arc::clone(&n));
                }
                self.release_children(&n, queue);
            }
        }
    }

    fn release_children(&mut self, node: &Node, queue: &mut Vec<BlockRef>) {
        for child in node.children() {
            self.release_node(child, queue);
        }
        for (_, r) in node.extents() {
            self.release_value(ValueRef::Extent(r));
        }
    }

    /// Frees a queued, unreferenced written node: its children lose a parent and its
    /// own bytes are freed.
    pub(crate) fn release_queued(&mut self, r: BlockRef, queue: &mut Vec<BlockRef>) -> Result<()> {
        let node = self.loader.load(r)?;
        self.release_children(&node, queue);
        self.free_written(r);
        Ok(())
    }

    /// Frees the written node at `r`: its bytes, its back references, and its place
    /// in the page cache.
    fn free_written(&mut self, r: BlockRef) {
        self.delta.free(r);
        end_backrefs(self.backrefs, r);
        self.loader.cache.remove(r.addr);
    }
}

/// Records that the written node at `r` is gone: none of its pointers is a back
/// reference any more. One record for the node, whatever its fan-out.
pub(crate) fn end_backrefs(backrefs: &mut WriteStore, r: BlockRef) {
    backrefs.remove_parent(r.addr);
}

/// The written blocks a node points at: its children, or a leaf's value extents.
pub(crate) fn node_children(node: &Node) -> impl Iterator<Item = BlockRef> + '_ {
    let children = node.children().filter_map(ChildRef::disk_ref);
    children.chain(node.extents().map(|(_, r)| r))
}

/// Whether `slot` holds a node this transaction made dirty in `epoch` and alone holds:
/// shadowing it is a no-op.
fn exclusive(slot: &mut Child, epoch: u64) -> bool {
    match slot {
        Child::Mem(a) => a.epoch == epoch && a.disk.get().is_none() && Arc::get_mut(a).is_some(),
        Child::Disk(_) => false,
    }
}

/// Makes the node behind `slot` writable by this transaction and returns it.
pub(crate) fn shadow<'c>(slot: &'c mut Child, ctx: &mut WriteCtx<'_>) -> Result<&'c mut Node> {
    // The common case, first and without a reference-count lookup: a node this
    // transaction already made dirty in this epoch and alone holds. A dirty node has
    // no address, so every parent holds it through an `Arc`: a single holder means a
    // single parent (a count of one), and no reader or version can see it.
    if exclusive(slot, ctx.epoch) {
        debug_assert_eq!(ctx.count(&ctx.refs.target(slot)), 1);
        let Child::Mem(a) = slot else {
            unreachable!("checked above")
        };
        return Ok(Arc::get_mut(a).expect("checked above"));
    }
    let copy = match ctx.refs.target(slot) {
        Target::Block(r) => {
            let node = match slot {
                Child::Mem(n) => Arc::clone(n),
                Child::Disk(_) => ctx.loader.load_to_copy(r)?,
            };
            let t = Target::Block(r);
            if ctx.count(&t) > 1 {
                ctx.add_count(&t, -1);
                ctx.unshared.push(r.addr);
                ctx.add_parent_to_children(&node);
            } else {
                ctx.free_written(r);
            }
            *ctx.copied_written_bytes += node.size as u64;
            Some(ctx.copy(&node))
        }
        Target::Mem(arc) => {
            let t = Target::Mem(arc);
            if ctx.count(&t) > 1 {
                let arc = Arc::clone(arc);
                ctx.add_count(&Target::Mem(&arc), -1);
                if let Some(r) = arc.disk.get() {
                    ctx.unshared.push(r.addr);
                }
                ctx.add_parent_to_children(&arc);
                Some(ctx.copy(&arc))
            } else if arc.disk.get().is_some() || arc.epoch != ctx.epoch {
                ctx.superseded.push(arc.clone());
                Some(ctx.copy(arc))
            } else if let Child::Mem(a) = slot {
                if Arc::get_mut(a).is_none() {
                    // Dirty in this epoch and held by a reader's view too: the copy
                    // takes the node's place (the view's copy is never written), so
                    // it adds nothing to the bytes a checkpoint will write.
                    let copy = ctx.copy(a);
                    *slot = Child::Mem(Arc::new(copy));
                }
                None
            } else {
                unreachable!("a Mem target comes from a Mem child")
            }
        }
    };
    if let Some(node) = copy {
        *slot = ctx.new_dirty(node);
    }
    match slot {
        Child::Mem(arc) => Ok(Arc::get_mut(arc).expect("a fresh or exclusively owned dirty node")),
        Child::Disk(_) => unreachable!("shadow leaves a Mem child"),
    }
}

/// Shadows the child of a branch at `parent_level`, checking that it is one level
/// down (a corrupted pointer must not let a write descend into the wrong kind of node).
fn shadow_child<'c>(
    slot: &'c mut Child,
    parent_level: u8,
    ctx: &mut WriteCtx<'_>,
) -> Result<&'c mut Node> {
    let child = shadow(slot, ctx)?;
    if child.level + 1 != parent_level {
        return Err(crate::error::Error::corrupted(
            "node",
            "child level does not match its parent",
        ));
    }
    Ok(child)
}

/// Most entries a write leaves in a branch, whatever their size. Every small commit
/// copies the branches on its path (the previous commit's published view holds
/// them), at a reference-count bump per child, usually a cache miss: short keys (a
/// volume's 9-byte block numbers) would otherwise put ~300 entries in an 8 KiB
/// branch. 160 keeps a million 24-byte keys 3 levels deep (~22k leaves).
const BRANCH_ENTRIES_MAX: usize = 160;

fn leaf_needs_split(node: &Node, incoming: usize) -> bool {
    node.size + incoming > NODE_MAX && node.len() >= 2
}

fn branch_needs_split(node: &Node, key_len: usize) -> bool {
    (node.size + branch_entry_size(key_len) > NODE_MAX || node.len() >= BRANCH_ENTRIES_MAX)
        && node.len() >= 2
}

fn needs_split(node: &Node, key_len: usize, leaf_incoming: usize) -> bool {
    if node.is_leaf() {
        leaf_needs_split(node, leaf_incoming)
    } else {
        branch_needs_split(node, key_len)
    }
}

/// How to split a full node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SplitAt {
    /// In two halves by bytes: room on both sides for keys arriving anywhere.
    Middle,
    /// Before the last entry: the append fast path. Keys arriving in ascending order
    /// at the right edge of the tree (an import of sorted data) would leave every
    /// node half empty behind them if split in the middle; split here, the nodes
    /// they leave behind are full.
    Last,
}

impl SplitAt {
    /// The split for an insert of `key` into `node`: `Last` when the node is on the
    /// tree's right edge and `key` goes after all of its keys.
    fn for_insert(node: &Node, rightmost: bool, key: &[u8]) -> SplitAt {
        let past_end = node.len() > 0 && key > node.key(node.len() - 1);
        if rightmost && past_end {
            SplitAt::Last
        } else {
            SplitAt::Middle
        }
    }
}

/// Splits `node` in two; `node` keeps the left part, the right part is returned. Both
/// are non-empty.
fn split(node: &mut Node, epoch: u64, how: SplitAt) -> Node {
    let half = node.size / 2;
    let len = node.len();
    let at = |sizes: &mut dyn Iterator<Item = usize>| match how {
        SplitAt::Middle => split_point(sizes, half, len),
        SplitAt::Last => len - 1,
    };
    match &mut node.body {
        Body::Leaf(leaf) => {
            let at = at(&mut leaf.iter().map(|(k, v)| entry_size(k.len(), v)));
            let right = leaf.split_off(at);
            let left = std::mem::take(leaf);
            *node = Node::new_leaf(left, epoch);
            Node::new_leaf(right, epoch)
        }
        Body::Branch(entries) => {
            let at = at(&mut entries.iter().map(|e| branch_entry_size(e.key.len())));
            let right = entries.split_off(at);
            let left = std::mem::take(entries);
            let level = node.level;
            *node = Node::new_branch(level, left, epoch);
            Node::new_branch(level, right, epoch)
        }
        Body::Packed(_) => unreachable!("shadow unpacks a node before a writer edits it"),
    }
}

/// The index where the running size first reaches `half`, kept inside `1..len`.
fn split_point(sizes: impl Iterator<Item = usize>, half: usize, len: usize) -> usize {
    let mut sum = super::node::HEADER_SIZE;
    let mut at = len;
    for (i, s) in sizes.enumerate() {
        sum += s;
        if sum >= half {
            at = i + 1;
            break;
        }
    }
    at.clamp(1, len - 1)
}

/// Inserts or replaces `key`. Returns the value it replaced.
pub(crate) fn insert(
    root: &mut Option<Child>,
    key: &[u8],
    value: ValueRef<'_>,
    ctx: &mut WriteCtx<'_>,
) -> Result<Option<OldValue>> {
    let mut old = None;
    let never = || false;
    insert_from(
        root,
        &[(key, value)],
        ctx,
        &mut |_, replaced| old = Some(replaced),
        &never,
    )?;
    Ok(old)
}

/// Inserts or replaces every entry of `run`, whose keys strictly ascend: the same as
/// an [`insert`] of each in turn. `replaced` hears of each value replaced, with the
/// index of the entry that replaced it. The entries that follow one into its leaf
/// go there without a descent from the root: a volume's landing maps hundreds of
/// consecutive blocks, most of them into the leaf the block before went to.
/// Between two entries, `stop` may end the run early (someone waits for the writer
/// lock); returns how many entries went in (all, or at least one).
pub(crate) fn insert_run(
    root: &mut Option<Child>,
    run: &[(&[u8], ValueRef<'_>)],
    ctx: &mut WriteCtx<'_>,
    replaced: &mut dyn FnMut(usize, OldValue),
    stop: &dyn Fn() -> bool,
) -> Result<usize> {
    debug_assert!(
        run.windows(2).all(|w| w[0].0 < w[1].0),
        "keys not ascending"
    );
    let mut done = 0;
    while done < run.len() {
        if done > 0 && stop() {
            break;
        }
        let from = done;
        let mut replaced_here = |i: usize, old| replaced(from + i, old);
        done += insert_from(root, &run[from..], ctx, &mut replaced_here, stop)?;
    }
    Ok(done)
}

/// Inserts `run[0]`, then the entries after it that belong in the same leaf and fit
/// there without a split, until `stop`; returns how many it placed (at least one).
fn insert_from(
    root: &mut Option<Child>,
    run: &[(&[u8], ValueRef<'_>)],
    ctx: &mut WriteCtx<'_>,
    replaced: &mut dyn FnMut(usize, OldValue),
    stop: &dyn Fn() -> bool,
) -> Result<usize> {
    let (key, value) = run[0];
    let incoming = entry_size(key.len(), value);
    let Some(slot) = root else {
        let leaf = Node::new_leaf(LeafBuf::from_entries([(key, value)]), ctx.epoch);
        *root = Some(ctx.new_dirty(leaf));
        return Ok(1);
    };
    let node = shadow(slot, ctx)?;
    if needs_split(node, key.len(), incoming) {
        let level = node.level + 1;
        let right = split(node, ctx.epoch, SplitAt::for_insert(node, true, key));
        let right_key: Key = right.first_key().expect("non-empty half").into();
        let left_key: Key = node.first_key().expect("non-empty half").into();
        let left_child = slot.clone();
        let right_child = ctx.new_dirty(right);
        let new_root = Node::new_branch(
            level,
            vec![
                BranchEntry {
                    key: left_key,
                    child: left_child,
                },
                BranchEntry {
                    key: right_key,
                    child: right_child,
                },
            ],
            ctx.epoch,
        );
        *slot = ctx.new_dirty(new_root);
    }
    let node = shadow(slot, ctx)?;
    insert_below(node, run, None, true, ctx, replaced, stop)
}

/// Inserts `run[0]` into a writable node that has room for what this insert may add
/// to it, then, in the leaf it reaches, the entries after it with keys under `upper`
/// (the first key of whatever follows the node, if anything does) that fit, until
/// `stop`; returns how many it placed. `rightmost`: the node is on the tree's right
/// edge (see [`SplitAt::Last`]).
fn insert_below(
    node: &mut Node,
    run: &[(&[u8], ValueRef<'_>)],
    upper: Option<&[u8]>,
    rightmost: bool,
    ctx: &mut WriteCtx<'_>,
    replaced: &mut dyn FnMut(usize, OldValue),
    stop: &dyn Fn() -> bool,
) -> Result<usize> {
    let Node {
        body, size, level, ..
    } = node;
    match body {
        Body::Leaf(leaf) => {
            // Where the next key is, if it is the one after the last (a run over
            // consecutive keys that are all here): one comparison, not a search.
            let mut next = None;
            for (n, &(key, value)) in run.iter().enumerate() {
                if n > 0 && (upper.is_some_and(|upper| key >= upper) || stop()) {
                    return Ok(n);
                }
                let incoming = entry_size(key.len(), value);
                let found = match next {
                    Some(i) if i < leaf.len() && leaf.key(i) == key => Ok(i),
                    _ => leaf.search(key),
                };
                match found {
                    Ok(i) => {
                        let old = leaf.value(i);
                        let grown = *size + incoming - entry_size(key.len(), old);
                        // The first entry had room made for it on the way down.
                        if n > 0 && grown > *size && grown > NODE_MAX {
                            return Ok(n);
                        }
                        *size = grown;
                        replaced(n, OldValue::of(old));
                        leaf.set_value(i, value);
                        next = Some(i + 1);
                    }
                    Err(i) => {
                        if n > 0 && *size + incoming > NODE_MAX {
                            return Ok(n);
                        }
                        leaf.insert(i, key, value);
                        *size += incoming;
                        next = Some(i + 1);
                    }
                }
            }
            Ok(run.len())
        }
        Body::Branch(entries) => {
            let (key, value) = run[0];
            let incoming = entry_size(key.len(), value);
            let mut idx = child_index(entries, &Probe::new(key));
            if idx == 0 && key < &*entries[0].key {
                // Min-key rule: the leftmost separator follows a new minimum down.
                *size = *size + key.len() - entries[0].key.len();
                entries[0].key = key.into();
            }
            let child_rightmost = rightmost && idx + 1 == entries.len();
            let child = shadow_child(&mut entries[idx].child, *level, ctx)?;
            if needs_split(child, key.len(), incoming) {
                let how = SplitAt::for_insert(child, child_rightmost, key);
                let right = split(child, ctx.epoch, how);
                let right_key: Key = right.first_key().expect("non-empty half").into();
                *size += branch_entry_size(right_key.len());
                let go_right = key >= &*right_key;
                let right_child = ctx.new_dirty(right);
                entries.insert(
                    idx + 1,
                    BranchEntry {
                        key: right_key,
                        child: right_child,
                    },
                );
                if go_right {
                    idx += 1;
                }
            }
            let child_rightmost = rightmost && idx + 1 == entries.len();
            let (through, after) = entries.split_at_mut(idx + 1);
            let child_upper = after.first().map(|e| &*e.key).or(upper);
            let child = shadow(&mut through[idx].child, ctx)?;
            insert_below(
                child,
                run,
                child_upper,
                child_rightmost,
                ctx,
                replaced,
                stop,
            )
        }
        Body::Packed(_) => unreachable!("shadow unpacks a node before a writer edits it"),
    }
}

/// Deletes `key`. Returns its value if it was present. A key that is absent changes
/// nothing (no node is shadowed, nothing is merged).
///
/// One descent: while the path is this transaction's own dirty nodes, shadowing them
/// changes nothing, so the descent goes ahead without knowing whether the key is
/// there. Before the first step that would change something (copying a node that is
/// not exclusively ours, or fixing a thin child), it looks the key up from there down,
/// read-only, and stops if it is absent ([`Presence`]). A large delete transaction owns
/// the upper levels after its first few deletes, so most deletes look up only the leaf.
pub(crate) fn delete(
    root: &mut Option<Child>,
    key: &[u8],
    ctx: &mut WriteCtx<'_>,
) -> Result<Option<OldValue>> {
    let Some(slot) = root.as_mut() else {
        return Ok(None);
    };
    let mut presence = Presence::Unknown;
    if !presence.confirm_before_change(slot, key, ctx)? {
        return Ok(None);
    }
    let node = shadow(slot, ctx)?;
    let old = delete_below(node, key, &mut presence, ctx)?;
    collapse_root(root, ctx.epoch);
    Ok(old)
}

/// Whether a delete's key is known to be in the tree.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Presence {
    Unknown,
    Confirmed,
}

impl Presence {
    /// Called before a step below `slot` that may change the tree (shadowing `slot`,
    /// fixing it): returns whether the delete may go on, looking the key up in
    /// `slot`'s subtree first if that step would change something and the key is
    /// not confirmed yet.
    fn confirm_before_change(
        &mut self,
        slot: &mut Child,
        key: &[u8],
        ctx: &WriteCtx<'_>,
    ) -> Result<bool> {
        if *self == Presence::Confirmed || exclusive(slot, ctx.epoch) {
            return Ok(true);
        }
        self.confirm(slot, key, ctx)
    }

    /// Looks the key up in `slot`'s subtree, read-only.
    fn confirm(&mut self, slot: &Child, key: &[u8], ctx: &WriteCtx<'_>) -> Result<bool> {
        if *self == Presence::Confirmed {
            return Ok(true);
        }
        let found = super::contains(ctx.loader, Some(slot), key)?;
        if found {
            *self = Presence::Confirmed;
        }
        Ok(found)
    }
}

/// An empty root empties the tree; a branch root with one child is replaced by it.
fn collapse_root(root: &mut Option<Child>, epoch: u64) {
    loop {
        if root.as_mut().is_some_and(|r| is_hollow(r, epoch)) {
            *root = None;
            return;
        }
        // Only a root this delete copied may be dropped (it frees nothing written);
        // a child that became the root without being on the delete's path stays.
        let Some(slot) = root.as_mut() else {
            return;
        };
        if !exclusive(slot, epoch) {
            return;
        }
        let Child::Mem(node) = slot else {
            return;
        };
        match &node.body {
            Body::Branch(e) if e.len() == 1 => {
                let child = e[0].child.clone();
                *root = Some(child);
            }
            _ => return,
        }
    }
}

fn delete_below(
    node: &mut Node,
    key: &[u8],
    presence: &mut Presence,
    ctx: &mut WriteCtx<'_>,
) -> Result<Option<OldValue>> {
    let Node {
        body, size, level, ..
    } = node;
    match body {
        Body::Leaf(leaf) => match leaf.search(key) {
            Ok(i) => {
                let old = leaf.value(i);
                *size -= entry_size(key.len(), old);
                let old = OldValue::of(old);
                leaf.remove(i);
                Ok(Some(old))
            }
            Err(_) => Ok(None),
        },
        Body::Branch(entries) => {
            let mut idx = child_index(entries, &Probe::new(key));
            if !presence.confirm_before_change(&mut entries[idx].child, key, ctx)? {
                return Ok(None);
            }
            let child = shadow_child(&mut entries[idx].child, *level, ctx)?;
            if child.size < NODE_MIN && entries.len() > 1 {
                // A fix merges or rebalances with a sibling: a change, whoever owns them.
                if !presence.confirm(&entries[idx].child, key, ctx)? {
                    return Ok(None);
                }
                let size_change = fix(entries, idx, ctx)?;
                // A merge or a rebalance moves the boundary: look the key up again.
                idx = child_index(entries, &Probe::new(key));
                *size = usize::try_from(i64::try_from(*size).expect("fits") + size_change)
                    .expect("node size stays positive");
            }
            let child = shadow(&mut entries[idx].child, ctx)?;
            let old = delete_below(child, key, presence, ctx)?;
            // The fix above runs only for a child already thin: a child with a few
            // large entries can be emptied by deletes without ever being thin. An
            // empty subtree leaves (this delete's copy of it: nothing written is
            // freed), or a store whose keys are all deleted would keep a tree of
            // empty nodes.
            if entries.len() > 1 && is_hollow(&mut entries[idx].child, ctx.epoch) {
                let removed = entries.remove(idx);
                *size -= branch_entry_size(removed.key.len());
            }
            Ok(old)
        }
        Body::Packed(_) => unreachable!("shadow unpacks a node before a writer edits it"),
    }
}

/// Whether `child` is a subtree with no entries (an empty leaf, or a branch whose only
/// child is one) made of this transaction's own copies, so that dropping it frees
/// nothing written and changes no count. (A node not exclusively ours, say an empty
/// leaf an older build wrote, is never dropped: its count and space would leak.)
fn is_hollow(child: &mut Child, epoch: u64) -> bool {
    if !exclusive(child, epoch) {
        return false;
    }
    let Child::Mem(node) = child else {
        return false;
    };
    let Some(node) = Arc::get_mut(node) else {
        return false;
    };
    match &mut node.body {
        Body::Leaf(e) => e.is_empty(),
        Body::Branch(e) => e.is_empty() || (e.len() == 1 && is_hollow(&mut e[0].child, epoch)),
        Body::Packed(_) => false,
    }
}

/// Fixes the thin child at `idx` by merging it with a neighbour, or, when the two
/// would be too big together, by moving entries between them. Returns the change in
/// the parent's size.
fn fix(entries: &mut Vec<BranchEntry>, idx: usize, ctx: &mut WriteCtx<'_>) -> Result<i64> {
    let left_idx = if idx + 1 < entries.len() {
        idx
    } else {
        idx - 1
    };
    let (head, tail) = entries.split_at_mut(left_idx + 1);
    let left = shadow(&mut head[left_idx].child, ctx)?;
    let right = shadow(&mut tail[0].child, ctx)?;
    let entries_after = left.len() + right.len();
    let branch_fits = left.is_leaf() || entries_after <= BRANCH_ENTRIES_MAX * 3 / 4;
    if left.size + right.size - super::node::HEADER_SIZE <= MERGE_MAX && branch_fits {
        merge_into(left, right);
        let removed = entries.remove(left_idx + 1);
        let change = -i64::try_from(branch_entry_size(removed.key.len())).expect("small");
        return Ok(change);
    }
    rebalance(left, right, ctx.epoch);
    let new_key: Key = right
        .first_key()
        .expect("rebalanced nodes are non-empty")
        .into();
    let old_len = entries[left_idx + 1].key.len();
    let change =
        i64::try_from(new_key.len()).expect("small") - i64::try_from(old_len).expect("small");
    entries[left_idx + 1].key = new_key;
    Ok(change)
}

/// Appends all of `right`'s entries to `left`, leaving `right` empty.
fn merge_into(left: &mut Node, right: &mut Node) {
    match (&mut left.body, &mut right.body) {
        (Body::Leaf(l), Body::Leaf(r)) => l.append_all(r),
        (Body::Branch(l), Body::Branch(r)) => l.append(r),
        _ => unreachable!("siblings are at the same level"),
    }
    left.size += right.size - super::node::HEADER_SIZE;
    right.size = super::node::HEADER_SIZE;
}

/// Moves entries between two siblings until their sizes are as even as entries allow.
fn rebalance(left: &mut Node, right: &mut Node, epoch: u64) {
    let level = left.level;
    let (sizes, all): (Vec<usize>, Body) = match (&mut left.body, &mut right.body) {
        (Body::Leaf(l), Body::Leaf(r)) => {
            let mut all = std::mem::take(l);
            all.append_all(r);
            (
                all.iter().map(|(k, v)| entry_size(k.len(), v)).collect(),
                Body::Leaf(all),
            )
        }
        (Body::Branch(l), Body::Branch(r)) => {
            let mut all = std::mem::take(l);
            all.append(r);
            (
                all.iter().map(|e| branch_entry_size(e.key.len())).collect(),
                Body::Branch(all),
            )
        }
        _ => unreachable!("siblings are at the same level, unpacked by shadow"),
    };
    let total: usize = sizes.iter().sum::<usize>() + super::node::HEADER_SIZE;
    let at = split_point(
        sizes.into_iter(),
        total / 2,
        match &all {
            Body::Leaf(e) => e.len(),
            Body::Branch(e) => e.len(),
            Body::Packed(_) => unreachable!("shadow unpacks a node before a writer edits it"),
        },
    );
    match all {
        Body::Leaf(mut e) => {
            let r = e.split_off(at);
            *left = Node::new_leaf(e, epoch);
            *right = Node::new_leaf(r, epoch);
        }
        Body::Branch(mut e) => {
            let r = e.split_off(at);
            *left = Node::new_branch(level, e, epoch);
            *right = Node::new_branch(level, r, epoch);
        }
        Body::Packed(_) => unreachable!("shadow unpacks a node before a writer edits it"),
    }
}
