//! Spilling: a large transaction writes its own dirty nodes out before it commits, so
//! its memory stays bounded whatever its size.
//!
//! A transaction edits a private copy-on-write tree: the nodes it made dirty are
//! reachable only through its working root, until commit. A *large* transaction
//! commits by checkpoint, with no WAL record (`super::LARGE_TXN_BYTES`), so nothing
//! requires its nodes to stay in memory until then: [`spill`] writes them to the
//! segments, bottom-up like a checkpoint, and replaces them in the working tree by
//! their addresses. The transaction goes on as if a checkpoint had written them: a
//! later edit of a spilled node copies it and frees its address (`btree::shadow`).
//!
//! Which nodes spill: those the transaction alone holds (one `Arc` holder, dirty, of
//! the current epoch), whose children are all written and named by address in the
//! reference counts. A node the committed tree or a reader's view also holds, or one
//! a checkpoint in flight is writing, is never written here (it belongs to the
//! checkpoint of its epoch), and neither are its ancestors; leaves always qualify, so
//! all but a bounded set of branches spill.
//!
//! Accounting, as a checkpoint's writes but into the transaction's own `Changes`:
//! each spilled node's bytes are allocated in its space delta and each of its
//! pointers becomes a back reference (`From`); a spilled node freed later in the
//! same transaction frees its bytes and ends its edges (`Gone`) like any written
//! node. So on commit the checkpoint persists exactly what the tree holds, and on
//! abort the whole `Changes` is dropped: spilled nodes were never live, and are dead
//! bytes in their segment, as are the value extents an aborted transaction wrote.
//!
//! Crash safety: nothing durable names a spilled node before the commit's
//! checkpoint, which fsyncs the segments (every append is in their unsynced set)
//! before its superblock. A crash before that leaves them as unreferenced bytes.
//! Segment deletion cannot take a segment a spill wrote into: a segment is deletable
//! only when no append can reach it since a freeze (`crate::space::AppendFence`), and
//! no freeze happens while the transaction holds the writer lock.

use crate::backref::WriteStore;
use crate::btree::node::{Body, Child, Node};
use crate::btree::refcount::{RefCounts, Target};
use crate::checkpoint;
use crate::engine::Shared;
use crate::error::Result;
use crate::space::SpaceDelta;
use std::collections::HashSet;
use std::sync::Arc;

/// What a spill wrote: the space it allocated and the back references its nodes hold.
pub(crate) struct Spilled {
    pub written: SpaceDelta,
    pub edges: WriteStore,
}

/// Writes the spillable nodes of the tree at `root` (see the module docs) and names
/// them by address in it. `epoch` is the writer's epoch, `refs` its reference counts.
pub(crate) fn spill(
    shared: &Shared,
    refs: &RefCounts,
    epoch: u64,
    root: &mut Option<Child>,
) -> Result<Spilled> {
    let mut levels: Vec<Vec<Arc<Node>>> = Vec::new();
    if let Some(r) = root.as_ref() {
        collect(r, refs, epoch, &mut levels);
    }
    let mut written = SpaceDelta::default();
    let mut edges = WriteStore::default();
    checkpoint::write_levels(shared, &levels, &mut written, &mut edges)?;
    let spilled: HashSet<*const Node> = levels.iter().flatten().map(Arc::as_ptr).collect();
    drop(levels);
    if let Some(r) = root.as_mut() {
        unlink(r, &spilled);
    }
    Ok(Spilled { written, edges })
}

/// Whether the transaction alone holds `n`, a dirty node it made.
fn owned(n: &Arc<Node>, epoch: u64) -> bool {
    Arc::strong_count(n) == 1 && n.is_dirty() && n.epoch == epoch
}

/// Collects the spillable nodes below `slot` (post-order, one list per level) and
/// returns whether `slot` will be named by address once they are written.
fn collect(slot: &Child, refs: &RefCounts, epoch: u64, levels: &mut Vec<Vec<Arc<Node>>>) -> bool {
    let n = match slot {
        Child::Disk(_) => return true,
        // Ownership is checked before any clone of `n` is taken (below).
        Child::Mem(n) if owned(n, epoch) => n,
        // Not the transaction's: fine as a child only if its count is filed under
        // its address, so that a spilled parent naming it by address sees the same
        // count when it is read back.
        Child::Mem(_) => return matches!(refs.target(slot), Target::Block(_)),
    };
    let children_ok = match &n.body {
        Body::Branch(entries) => {
            // Every child is visited, also after one that cannot spill: its own
            // spillable descendants still go.
            let mut all = true;
            for e in entries {
                all &= collect(&e.child, refs, epoch, levels);
            }
            all
        }
        // A packed branch names its children by address only.
        Body::Leaf(_) | Body::Packed(_) => true,
    };
    if children_ok {
        let level = usize::from(n.level);
        if levels.len() <= level {
            levels.resize_with(level + 1, Vec::new);
        }
        levels[level].push(Arc::clone(n));
    }
    children_ok
}

/// Replaces every spilled node below `slot` (and `slot` itself) by its address, so
/// the working tree no longer holds it in memory. Descends only through nodes the
/// transaction alone holds: only those can point at a spilled node.
fn unlink(slot: &mut Child, spilled: &HashSet<*const Node>) {
    let Child::Mem(n) = slot else { return };
    if spilled.contains(&Arc::as_ptr(n)) {
        let r = *n.disk.get().expect("a spilled node was written");
        *slot = Child::Disk(r);
        return;
    }
    if let Some(node) = Arc::get_mut(n) {
        if let Body::Branch(entries) = &mut node.body {
            for e in entries {
                unlink(&mut e.child, spilled);
            }
        }
    }
}
