//! Versions as users see them: snapshots, branches (writable clones), drop, the
//! version list with its space accounting, and diff.
//!
//! A snapshot or a branch copies a root and nothing else (Rodeh §5: the new root
//! points at the source's root node, whose reference count goes up by one). The trees
//! then share every node until a writer shadows one; the sharing is tracked by lazy
//! reference counts (`crate::btree::refcount`).
//!
//! ```
//! # fn main() -> cambium::Result<()> {
//! use cambium::Change;
//! let dir = tempfile::tempdir()?;
//! let store = cambium::Store::create(dir.path().join("db"))?;
//! store.put(b"model", b"v1")?;
//!
//! store.snapshot("main", "release-1")?; // O(1): shares main's tree
//! store.branch("release-1", "experiment")?; // a writable clone of the snapshot
//! let mut txn = store.begin_write_on("experiment")?;
//! txn.put(b"model", b"v2")?;
//! txn.commit()?;
//!
//! assert_eq!(store.read_at("release-1")?.get(b"model")?, Some(b"v1".to_vec()));
//! let changes: Vec<Change> = store.diff("release-1", "experiment")?.collect::<Result<_, _>>()?;
//! assert_eq!(
//!     changes,
//!     vec![Change::Changed { key: b"model".to_vec(), old: b"v1".to_vec(), new: b"v2".to_vec() }]
//! );
//!
//! store.drop_version("experiment")?; // its own nodes are freed in the background
//! let names: Vec<String> = store.versions()?.into_iter().map(|v| v.name).collect();
//! assert_eq!(names, ["main", "release-1"]);
//! # Ok(()) }
//! ```

use crate::btree::diff::TreeDiff;
use crate::btree::node::{Child, Node};
use crate::btree::refcount::{RcDelta, RefCounts, Target};
use crate::btree::walk::{walk, At, Visitor};
use crate::btree::Loader;
use crate::catalog::{check_version_name, VersionKind, MAIN_BRANCH};
use crate::commit::{log_and_apply, log_and_publish};
use crate::engine::{self, Shared, View};
use crate::error::{Error, Result};
use crate::format::now_unix_ms;
use crate::format::{Addr, AddrMap};
use crate::options::Durability;
use crate::subtree_memo;
use crate::wal::{Record, VersionOp};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One version of the store, as `Store::versions` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    /// A number that identifies the version in this store; never reused.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Branch or snapshot.
    pub kind: VersionKind,
    /// The id of the version it was made from (`None` for `main`, or when that
    /// version and all its ancestors have been dropped).
    pub parent_id: Option<u32>,
    /// The name of that version.
    pub parent: Option<String>,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The LSN of the operation that made it (0 for `main`).
    pub created_lsn: u64,
    /// The generation of the durable checkpoint when it was made.
    pub created_checkpoint: u64,
    /// Bytes of nodes and values reachable from this version (ZFS's `referenced`).
    pub referenced_bytes: u64,
    /// Bytes reachable only from this version: what dropping it would free (ZFS's
    /// `used` by the dataset itself).
    pub exclusive_bytes: u64,
    /// Keys in the version.
    pub keys: u64,
}

/// One difference between two versions, as `Store::diff` yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The key is in the second version only.
    Added {
        /// The key.
        key: Vec<u8>,
        /// Its value in the second version.
        value: Vec<u8>,
    },
    /// The key is in the first version only.
    Removed {
        /// The key.
        key: Vec<u8>,
        /// Its value in the first version.
        old: Vec<u8>,
    },
    /// The key is in both, with different values.
    Changed {
        /// The key.
        key: Vec<u8>,
        /// Its value in the first version.
        old: Vec<u8>,
        /// Its value in the second version.
        new: Vec<u8>,
    },
}

impl Change {
    /// The key this change is about.
    pub fn key(&self) -> &[u8] {
        match self {
            Change::Added { key, .. }
            | Change::Removed { key, .. }
            | Change::Changed { key, .. } => key,
        }
    }
}

/// The changes between two versions, in key order; see `Store::diff`.
pub struct Diff {
    shared: Arc<Shared>,
    /// Keeps both roots, and the segments they reach, alive.
    _view: Arc<View>,
    tree: TreeDiff,
    failed: bool,
}

impl std::fmt::Debug for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Diff").finish_non_exhaustive()
    }
}

impl Iterator for Diff {
    type Item = Result<Change>;

    fn next(&mut self) -> Option<Result<Change>> {
        if self.failed {
            return None;
        }
        let loader = self.shared.loader();
        let change = self.tree.next(loader).and_then(|d| {
            let Some(d) = d else { return Ok(None) };
            let key = d.key.to_vec();
            Ok(Some(match (d.old, d.new) {
                (None, Some(v)) => Change::Added {
                    key,
                    value: loader.value(v.as_ref())?,
                },
                (Some(v), None) => Change::Removed {
                    key,
                    old: loader.value(v.as_ref())?,
                },
                (Some(o), Some(n)) => Change::Changed {
                    key,
                    old: loader.value(o.as_ref())?,
                    new: loader.value(n.as_ref())?,
                },
                (None, None) => unreachable!("a difference has a side"),
            }))
        });
        match change {
            Ok(c) => c.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Nodes a drop step frees before it lets go of the writer lock.
pub(crate) const DROP_STEP_NODES: usize = 256;

/// Makes version `name` of `source`: one logged record and one more reference on the
/// source's root; constant time.
///
/// Returns when the version came to exist: the moment it was made under the writer
/// lock, holding every commit before it (what a writer may have waited for; making it
/// durable comes after, and so may the caller's thread's next turn on a busy CPU).
pub(crate) fn make_version(
    shared: &Shared,
    source: Option<&str>,
    name: &str,
    kind: VersionKind,
    durability: Durability,
) -> Result<Instant> {
    check_version_name(name)?;
    let source = source.map(str::to_owned);
    let name = name.to_owned();
    // Lent when the cleaner holds the writer lock: making a version dirties no node,
    // and a snapshot of a busy volume must not wait for a cleaner round.
    let (logged, made) = shared.with_writer_lent(move |shared, w| {
        let source_id = match source {
            None => None,
            Some(source) => Some(
                w.catalog
                    .by_name(&source)
                    .ok_or(Error::VersionNotFound(source))?
                    .id
                    .0,
            ),
        };
        if w.catalog.by_name(&name).is_some() {
            return Err(Error::VersionExists(name));
        }
        let id = w.catalog.next_id;
        if id == u32::MAX {
            return Err(Error::InvalidArgument("version ids exhausted".into()));
        }
        let op = VersionOp::Create {
            id,
            source: source_id,
            snapshot: kind == VersionKind::Snapshot,
            created_unix_ms: now_unix_ms(),
            created_checkpoint: shared.durable_generation(),
            name,
        };
        let record = Record::Version(op.clone());
        let ((), logged) = log_and_apply(shared, w, &record, |w, lsn| {
            engine::create_version(w, &op, lsn)
        })?;
        Ok((logged, Instant::now()))
    })?;
    logged.publish(shared, durability)?;
    Ok(made)
}

/// Removes version `name`; the walk that frees its nodes runs in the background.
/// With `only_id`, only if `name` is still that version (not another made under the
/// same name since): otherwise `VersionNotFound`.
pub(crate) fn drop_version(shared: &Shared, name: &str, only_id: Option<u32>) -> Result<()> {
    if name == MAIN_BRANCH {
        return Err(Error::DefaultBranch(name.to_owned()));
    }
    // The drop's record frees space: on a full disk it may use the reserve.
    let _allowed = crate::io::allow_reserve();
    let w = shared.lock_writer_checked()?;
    let id = w
        .catalog
        .by_name(name)
        .filter(|v| only_id.is_none_or(|only| v.id.0 == only))
        .ok_or_else(|| Error::VersionNotFound(name.to_owned()))?
        .id;
    let record = Record::Version(VersionOp::Drop { id: id.0 });
    let queued = log_and_publish(shared, w, &record, Durability::Immediate, |w, _| {
        engine::drop_version(w, shared.loader(), id);
        Ok(!w.drop_queue.is_empty())
    })?;
    if queued {
        shared.wake_background();
    }
    Ok(())
}

/// Frees up to `budget` queued nodes of dropped versions, under the writer lock.
/// Returns whether work remains.
pub(crate) fn drop_step(shared: &Shared, budget: usize) -> Result<bool> {
    // Freeing dropped nodes frees space: on a full disk it may use the reserve.
    let _allowed = crate::io::allow_reserve();
    let mut w = shared.lock_writer_checked()?;
    if w.drop_queue.is_empty() {
        return Ok(false);
    }
    engine::drop_step(&mut w, shared.loader(), budget)
}

/// Runs the reclamation of dropped versions to the end.
pub(crate) fn finish_drops(shared: &Shared) -> Result<()> {
    while drop_step(shared, DROP_STEP_NODES)? {}
    Ok(())
}

/// Every version, in the order they were made, with its space accounting.
pub(crate) fn list(shared: &Shared) -> Result<Vec<VersionInfo>> {
    // The view keeps every block these trees reach from being deleted while the
    // walk below reads them (a clean may relocate them meanwhile).
    // Written subtrees never change (addresses are never reused), so their totals
    // are kept from one call to the next: a call reads only what changed since.
    // Copies of shared nodes since the last call gave their children another parent:
    // below them, not every block has one parent any more, and `current` clears
    // their flags. (No other count rises below a remembered subtree: see
    // `WriterState::unshared`.)
    let (mut known, (_view, catalog, refs)) = subtree_memo::current(shared, |w| {
        (shared.hold_space(&*w), w.catalog.clone(), w.refs.counts())
    });
    if known.len() > MAX_KNOWN_SUBTREES {
        known.clear();
    }
    let loader = shared.loader();
    let mut memo = SubtreeMemo::new();
    let mut out = Vec::with_capacity(catalog.versions.len());
    for v in &catalog.versions {
        let (referenced_bytes, keys) = match &v.root {
            Some(root) => referenced(loader, &refs, root, &mut memo, &mut known)?,
            None => (0, 0),
        };
        let exclusive_bytes = match &v.root {
            Some(root) => exclusive(loader, &refs, root, &known)?,
            None => 0,
        };
        let parent = v
            .parent
            .and_then(|p| catalog.versions.iter().find(|x| x.id == p));
        out.push(VersionInfo {
            id: v.id.0,
            name: v.name.to_string(),
            kind: v.kind,
            parent_id: parent.map(|p| p.id.0),
            parent: parent.map(|p| p.name.to_string()),
            created_unix_ms: v.created_unix_ms,
            created_lsn: v.created_lsn.0,
            created_checkpoint: v.created_checkpoint,
            referenced_bytes,
            exclusive_bytes,
            keys,
        });
    }
    Ok(out)
}

/// The changes from version `a` to version `b`, in key order.
pub(crate) fn diff(shared: &Arc<Shared>, a: &str, b: &str) -> Result<Diff> {
    let view = shared.published();
    let root = |name: &str| -> Result<Option<Child>> {
        view.root(name)
            .cloned()
            .ok_or_else(|| Error::VersionNotFound(name.to_owned()))
    };
    let (ra, rb) = (root(a)?, root(b)?);
    Ok(Diff {
        shared: shared.clone(),
        tree: TreeDiff::new(ra.as_ref(), rb.as_ref()),
        _view: view,
        failed: false,
    })
}

/// Written branch subtrees whose totals are kept across `versions()` calls, at most
/// (then the map starts again): about 40 bytes each.
const MAX_KNOWN_SUBTREES: usize = 1 << 20;

/// Subtree totals already computed during one `versions()` call, by node identity
/// (address once written, else the in-memory node): versions share most of their
/// subtrees, so the store is read once, not once per version.
type SubtreeMemo = HashMap<u64, Totals>;

fn identity(child: &Child) -> u64 {
    match (child.disk_ref(), child) {
        (Some(r), _) => r.addr.0,
        // In-memory addresses are below 2^63 on every platform we run on; written
        // addresses of such magnitude would need a segment id of 2^23.
        (None, Child::Mem(n)) => (Arc::as_ptr(n) as usize as u64) | (1 << 63),
        (None, Child::Disk(r)) => r.addr.0,
    }
}

/// Bytes a node takes on disk (or will, once written).
fn node_bytes(child: &Child, node: &Node) -> u64 {
    child
        .disk_ref()
        .map_or(node.size as u64, |r| u64::from(r.len))
}

use crate::engine::SubtreeTotals as Totals;

/// Bytes of the nodes and extents reachable from `root`, and the keys in it: a
/// post-order fold whose subtree totals are memoised across versions. Within one tree
/// nothing is reachable twice (an extent belongs to one leaf of a version).
fn referenced(
    loader: Loader<'_>,
    refs: &RefCounts,
    root: &Child,
    memo: &mut SubtreeMemo,
    known: &mut AddrMap<Addr, Totals>,
) -> Result<(u64, u64)> {
    struct Referenced<'m> {
        refs: &'m RefCounts,
        memo: &'m mut SubtreeMemo,
        /// Totals of written branch subtrees, kept across calls.
        known: &'m mut AddrMap<Addr, Totals>,
        /// Totals of the subtrees being folded, innermost last; the first is the result.
        open: Vec<Totals>,
    }
    impl Referenced<'_> {
        fn add(&mut self, t: Totals) {
            if let Some(top) = self.open.last_mut() {
                top.bytes += t.bytes;
                top.keys += t.keys;
                top.single &= t.single;
            }
        }

        fn count(&self, t: &Target<'_>) -> u32 {
            self.refs.count(t)
        }
    }
    impl Visitor for Referenced<'_> {
        fn enter(&mut self, at: &At<'_>) -> Result<bool> {
            let known = at
                .child
                .disk_ref()
                .and_then(|r| self.known.get(&r.addr).copied());
            let found = known.or_else(|| self.memo.get(&identity(at.child)).copied());
            // The parent's "single below" needs this child's own count too.
            let single = self.count(&self.refs.target(at.child)) <= 1;
            match found {
                Some(mut totals) => {
                    totals.single &= single;
                    self.add(totals);
                    Ok(false)
                }
                None => {
                    if !single {
                        if let Some(top) = self.open.last_mut() {
                            top.single = false;
                        }
                    }
                    Ok(true)
                }
            }
        }
        fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
            let mut totals = Totals {
                bytes: node_bytes(at.child, node),
                keys: 0,
                single: true,
            };
            if node.is_leaf() {
                totals.keys = node.len() as u64;
                for (_, r) in node.extents() {
                    totals.bytes += u64::from(r.len);
                    totals.single &= self.count(&Target::Block(r)) <= 1;
                }
            }
            self.open.push(totals);
            Ok(true)
        }
        fn leave(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<()> {
            let totals = self.open.pop().unwrap_or_default();
            self.memo.insert(identity(at.child), totals);
            if let Some(r) = at.child.disk_ref().filter(|_| node.level > 0) {
                // Branches only: a hit then saves reading every leaf below it, and
                // the map stays a small fraction of the node count.
                self.known.insert(r.addr, totals);
            }
            // Whether this node itself is shared was folded in by `enter`.
            self.add(totals);
            Ok(())
        }
    }
    let mut fold = Referenced {
        refs,
        memo,
        known,
        open: vec![Totals {
            single: true,
            ..Totals::default()
        }],
    };
    walk(&mut { loader }, root, &mut fold)?;
    let t = fold.open.first().copied().unwrap_or_default();
    Ok((t.bytes, t.keys))
}

/// Bytes that dropping the version at `root` would free: Rodeh's drop walk, run on a
/// scratch copy of the counts. A node is counted when its last parent goes; a node
/// other parents keep is not read at all, and a written subtree known to hold only
/// blocks with one parent is counted whole from its remembered totals, unread.
fn exclusive(
    loader: Loader<'_>,
    refs: &RefCounts,
    root: &Child,
    known: &AddrMap<Addr, Totals>,
) -> Result<u64> {
    struct Exclusive<'r> {
        refs: &'r RefCounts,
        known: &'r AddrMap<Addr, Totals>,
        rc: RcDelta,
        bytes: u64,
    }
    impl Exclusive<'_> {
        /// Takes one pointer away from `t`: true if it was the last one.
        fn release(&mut self, t: &Target<'_>) -> bool {
            if self.rc.count(self.refs, t) > 1 {
                self.rc.add(t, -1);
                false
            } else {
                true
            }
        }
    }
    impl Visitor for Exclusive<'_> {
        fn enter(&mut self, at: &At<'_>) -> Result<bool> {
            let t = self.refs.target(at.child);
            if !self.release(&t) {
                return Ok(false);
            }
            let whole = at
                .child
                .disk_ref()
                .and_then(|r| self.known.get(&r.addr))
                .filter(|totals| totals.single);
            match whole {
                Some(totals) => {
                    // Freed, and everything below has this subtree as its only
                    // parent: all of it goes.
                    self.bytes += totals.bytes;
                    Ok(false)
                }
                None => Ok(true),
            }
        }
        fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
            self.bytes += node_bytes(at.child, node);
            for (_, r) in node.extents() {
                if self.release(&Target::Block(r)) {
                    self.bytes += u64::from(r.len);
                }
            }
            Ok(true)
        }
    }
    let mut drop_walk = Exclusive {
        refs,
        known,
        rc: RcDelta::default(),
        bytes: 0,
    };
    walk(&mut { loader }, root, &mut drop_walk)?;
    Ok(drop_walk.bytes)
}

#[cfg(test)]
mod tests {
    //! Regression (286f068): the exclusive-bytes walk once lacked the level check, so a
    //! damaged child address naming a cached node at its own level made `versions()`
    //! loop. Both space-accounting walks must refuse such a tree with an error.
    use super::*;
    use crate::btree::walk::self_naming_tree;

    #[test]
    fn space_accounting_refuses_a_tree_that_names_itself() {
        let (segments, cache, root) = self_naming_tree();
        let loader = Loader {
            cache: &cache,
            segments: &segments,
        };
        let refs = RefCounts::default();
        let mut known = AddrMap::default();
        assert!(exclusive(loader, &refs, &root, &known)
            .unwrap_err()
            .is_corruption());
        let mut memo = SubtreeMemo::new();
        assert!(referenced(loader, &refs, &root, &mut memo, &mut known)
            .unwrap_err()
            .is_corruption());
    }
}
