//! Versions as users see them: snapshots, branches (writable clones), drop, the
//! version list with its space accounting, and diff.
//!
//! A snapshot or a branch copies a root and nothing else (Rodeh §5: the new root
//! points at the source's root node, whose reference count goes up by one). The trees
//! then share every node until a writer shadows one; the sharing is tracked by lazy
//! reference counts (`crate::refcount`).
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
use crate::btree::node::{Body, Child, Value};
use crate::btree::{Loader, WriteCtx};
use crate::catalog::{Version, VersionId};
use crate::error::{Error, Result};
use crate::format::Lsn;
use crate::refcount::{RcDelta, RefCounts, Target};
use crate::space::SpaceDelta;
use crate::store::{Shared, WriterState};
use crate::txn::View;
use crate::wal::{self, VersionOp};
use crate::Durability;
use serde::Serialize;
use std::sync::Arc;

/// Whether a version can be written.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    /// Writable.
    Branch,
    /// Read-only.
    Snapshot,
}

impl std::fmt::Display for VersionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VersionKind::Branch => "branch",
            VersionKind::Snapshot => "snapshot",
        })
    }
}

/// One version of the store, as [`crate::Store::versions`] reports it.
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

/// One difference between two versions, as [`crate::Store::diff`] yields it.
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

/// The longest version name, in bytes.
pub const MAX_VERSION_NAME_LEN: usize = 255;

/// Checks a new version's name: 1 to 255 bytes of ASCII letters, digits, `.`, `_`, `-`
/// and `/`, not starting with `-` or `.` (so it is never mistaken for a flag or a
/// path component like `..`).
pub fn check_version_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidVersionName(format!("{name:?}: {why}")));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_VERSION_NAME_LEN {
        return bad("longer than 255 bytes");
    }
    if name.starts_with(['-', '.']) {
        return bad("starts with '-' or '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return bad(&format!(
            "character {c:?} not allowed (use letters, digits, '.', '_', '-', '/')"
        ));
    }
    Ok(())
}

/// The changes between two versions, in key order; see [`crate::Store::diff`].
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
                    value: loader.value(&v)?,
                },
                (Some(v), None) => Change::Removed {
                    key,
                    old: loader.value(&v)?,
                },
                (Some(o), Some(n)) => Change::Changed {
                    key,
                    old: loader.value(&o)?,
                    new: loader.value(&n)?,
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
const DROP_STEP_NODES: usize = 256;

impl crate::Store {
    /// Makes a read-only version `name` of `source` (a branch or a snapshot), in
    /// constant time: it copies `source`'s root, never its data. Durable on return.
    pub fn snapshot(&self, source: &str, name: &str) -> Result<()> {
        self.snapshot_with(source, name, Durability::Immediate)
    }

    /// [`crate::Store::snapshot`] with a choice of durability: `Deferred` returns
    /// without waiting for the WAL fsync (the snapshot is visible at once and durable
    /// with the next fsync or checkpoint), for callers that make many at a time.
    pub fn snapshot_with(&self, source: &str, name: &str, durability: Durability) -> Result<()> {
        make_version(
            &self.shared,
            source,
            name,
            VersionKind::Snapshot,
            durability,
        )
    }

    /// Makes a writable clone `name` of `source` (a branch or a snapshot), in constant
    /// time. The two then diverge independently. Durable on return.
    pub fn branch(&self, source: &str, name: &str) -> Result<()> {
        self.branch_with(source, name, Durability::Immediate)
    }

    /// [`crate::Store::branch`] with a choice of durability (see
    /// [`crate::Store::snapshot_with`]).
    pub fn branch_with(&self, source: &str, name: &str, durability: Durability) -> Result<()> {
        make_version(&self.shared, source, name, VersionKind::Branch, durability)
    }

    /// Removes the version `name`. The version is gone at once (durable on return);
    /// the space only it referenced is reclaimed by a walk that proceeds in the
    /// background, in bounded steps (Rodeh §5.4: it stops at nodes other versions
    /// share, which just lose a reference). [`crate::Store::finish_drops`] runs it to
    /// the end. Versions made from this one keep all their data.
    pub fn drop_version(&self, name: &str) -> Result<()> {
        let shared = &self.shared;
        shared.check_writable()?;
        let mut w = shared.lock_writer();
        shared.check_writable()?;
        let id = w
            .catalog
            .by_name(name)
            .ok_or_else(|| Error::VersionNotFound(name.to_owned()))?
            .id;
        let op = VersionOp::Drop { id: id.0 };
        let lsn = w.last_lsn.next();
        shared.wal.append(lsn, wal::KIND_VERSION, &op.encode())?;
        apply_drop(&mut w, shared.loader(), id);
        w.last_lsn = lsn;
        let queued = !w.drop_queue.is_empty();
        let view = Arc::new(View::new(lsn, &w.catalog, shared.views.clone()));
        drop(w);
        shared
            .wal
            .sync_to(lsn, &shared.segments)
            .inspect_err(|e| shared.poison(e))?;
        shared.publish(view);
        if queued {
            shared.wake_background();
        }
        Ok(())
    }

    /// Frees up to `max_nodes` nodes of dropped versions and returns whether more
    /// remain: the background thread's unit of work, for applications that run
    /// without one ([`crate::Options::background_checkpoints`] off) and want to spread
    /// a big drop over their own idle time.
    pub fn drop_step(&self, max_nodes: usize) -> Result<bool> {
        drop_step(&self.shared, max_nodes.max(1))
    }

    /// Runs the reclamation of dropped versions to the end (it otherwise proceeds in
    /// the background). The space it frees is reusable after the next checkpoint.
    pub fn finish_drops(&self) -> Result<()> {
        while drop_step(&self.shared, DROP_STEP_NODES)? {}
        Ok(())
    }

    /// Every version, in the order they were made, with its space accounting. The
    /// figures count nodes as they are (or will be, once checkpointed) on disk.
    /// This reads every node of the store once (shared subtrees once), plus the
    /// nodes each version holds alone: its cost grows with the store.
    pub fn versions(&self) -> Result<Vec<VersionInfo>> {
        let shared = &self.shared;
        let (catalog, refs) = {
            let w = shared.lock_writer();
            (w.catalog.clone(), w.refs.clone())
        };
        let loader = shared.loader();
        let mut memo = SubtreeMemo::new();
        let mut out = Vec::with_capacity(catalog.versions.len());
        for v in &catalog.versions {
            let (referenced_bytes, keys) = match &v.root {
                Some(root) => referenced(loader, root, &mut memo, 0)?,
                None => (0, 0),
            };
            let exclusive_bytes = match &v.root {
                Some(root) => exclusive(loader, &refs, root)?,
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

    /// The keys added, removed and changed from version `a` to version `b`, in key
    /// order. It descends only where the two trees differ, so its cost follows the
    /// size of the change, not the size of the versions.
    pub fn diff(&self, a: &str, b: &str) -> Result<Diff> {
        let view = self.shared.published();
        let root = |name: &str| -> Result<Option<Child>> {
            view.versions
                .iter()
                .find(|v| &*v.name == name)
                .map(|v| v.root.clone())
                .ok_or_else(|| Error::VersionNotFound(name.to_owned()))
        };
        let (ra, rb) = (root(a)?, root(b)?);
        Ok(Diff {
            shared: self.shared.clone(),
            tree: TreeDiff::new(ra.as_ref(), rb.as_ref()),
            _view: view,
            failed: false,
        })
    }
}

fn make_version(
    shared: &Shared,
    source: &str,
    name: &str,
    kind: VersionKind,
    durability: Durability,
) -> Result<()> {
    check_version_name(name)?;
    shared.check_writable()?;
    let mut w = shared.lock_writer();
    shared.check_writable()?;
    let source_id = w
        .catalog
        .by_name(source)
        .ok_or_else(|| Error::VersionNotFound(source.to_owned()))?
        .id;
    if w.catalog.by_name(name).is_some() {
        return Err(Error::VersionExists(name.to_owned()));
    }
    let id = w.catalog.next_id;
    if id == u32::MAX {
        return Err(Error::InvalidArgument("version ids exhausted".into()));
    }
    let op = VersionOp::Create {
        id,
        source: source_id.0,
        snapshot: kind == VersionKind::Snapshot,
        created_unix_ms: crate::format::now_unix_ms(),
        created_checkpoint: shared.durable_generation(),
        name: name.to_owned(),
    };
    let lsn = w.last_lsn.next();
    shared.wal.append(lsn, wal::KIND_VERSION, &op.encode())?;
    apply_create(&mut w, op, lsn)?;
    w.last_lsn = lsn;
    let view = Arc::new(View::new(lsn, &w.catalog, shared.views.clone()));
    drop(w);
    if durability == Durability::Immediate {
        shared
            .wal
            .sync_to(lsn, &shared.segments)
            .inspect_err(|e| shared.poison(e))?;
    }
    shared.publish(view);
    Ok(())
}

/// Adds the version a `Create` record describes: its root is its source's root, which
/// gains a parent. Constant time.
fn apply_create(w: &mut WriterState, op: VersionOp, lsn: Lsn) -> Result<()> {
    let VersionOp::Create {
        id,
        source,
        snapshot,
        created_unix_ms,
        created_checkpoint,
        name,
    } = op
    else {
        unreachable!("apply_create takes a Create")
    };
    let root = w
        .catalog
        .versions
        .iter()
        .find(|v| v.id.0 == source)
        .ok_or_else(|| Error::corrupted("wal", format!("clone of unknown version {source}")))?
        .root
        .clone();
    if w.catalog.by_name(&name).is_some() || w.catalog.versions.iter().any(|v| v.id.0 == id) {
        return Err(Error::corrupted(
            "wal",
            format!("version {name:?} made twice"),
        ));
    }
    if let Some(root) = &root {
        let mut rc = RcDelta::default();
        rc.add(&w.refs.target(root), 1);
        w.refs.apply(rc);
    }
    w.catalog.versions.push(Version {
        id: VersionId(id),
        name: name.into(),
        kind: if snapshot {
            VersionKind::Snapshot
        } else {
            VersionKind::Branch
        },
        parent: Some(VersionId(source)),
        created_unix_ms,
        created_lsn: lsn,
        created_checkpoint,
        root,
    });
    w.catalog.next_id = w.catalog.next_id.max(id + 1);
    Ok(())
}

/// Removes version `id` from the catalog and releases its root. Versions made from
/// it are re-linked to its parent, so the tree of versions stays connected.
fn apply_drop(w: &mut WriterState, loader: Loader<'_>, id: VersionId) {
    let Some(at) = w.catalog.versions.iter().position(|v| v.id == id) else {
        return;
    };
    let gone = w.catalog.versions.remove(at);
    for v in &mut w.catalog.versions {
        if v.parent == Some(id) {
            v.parent = gone.parent;
        }
    }
    if let Some(root) = &gone.root {
        let mut queue = Vec::new();
        with_ctx(w, loader, |ctx| {
            ctx.release_node(root, &mut queue);
            Ok(())
        })
        .expect("releasing a root reads nothing");
        w.drop_queue.extend(queue);
    }
}

/// Runs `f` with a write context over the writer state and applies what it changed
/// (also when it fails half-way: each change it made is complete in itself).
fn with_ctx<T>(
    w: &mut WriterState,
    loader: Loader<'_>,
    f: impl FnOnce(&mut WriteCtx<'_>) -> Result<T>,
) -> Result<T> {
    let mut delta = SpaceDelta::default();
    let mut rc = RcDelta::default();
    let mut superseded = Vec::new();
    let mut dirtied = 0;
    let result = {
        let mut ctx = WriteCtx {
            loader,
            epoch: w.epoch,
            delta: &mut delta,
            superseded: &mut superseded,
            dirtied_bytes: &mut dirtied,
            keep_pinned: false,
            refs: &w.refs,
            rc: &mut rc,
        };
        f(&mut ctx)
    };
    w.refs.apply(rc);
    w.delta.merge(delta);
    w.superseded.extend(superseded);
    result
}

/// Frees up to `budget` queued nodes of dropped versions, under the writer lock.
/// Returns whether work remains.
pub(crate) fn drop_step(shared: &Shared, budget: usize) -> Result<bool> {
    shared.check_writable()?;
    let mut w = shared.lock_writer();
    if w.drop_queue.is_empty() {
        return Ok(false);
    }
    let mut queue = std::mem::take(&mut w.drop_queue);
    let result = with_ctx(&mut w, shared.loader(), |ctx| {
        for _ in 0..budget {
            let Some(r) = queue.pop() else { break };
            if let Err(e) = ctx.release_queued(r, &mut queue) {
                queue.push(r);
                return Err(e);
            }
        }
        Ok(())
    });
    w.drop_queue = queue;
    result.map(|()| !w.drop_queue.is_empty())
}

/// Replays a logged catalog change (recovery).
pub(crate) fn replay(
    w: &mut WriterState,
    loader: Loader<'_>,
    op: VersionOp,
    lsn: Lsn,
) -> Result<()> {
    match op {
        VersionOp::Create { .. } => apply_create(w, op, lsn),
        VersionOp::Drop { id } => {
            if !w.catalog.versions.iter().any(|v| v.id.0 == id) {
                return Err(Error::corrupted(
                    "wal",
                    format!("drop of unknown version {id}"),
                ));
            }
            apply_drop(w, loader, VersionId(id));
            Ok(())
        }
    }
}

/// Subtree totals already computed during one `versions()` call, by node identity
/// (address once written, else the in-memory node): versions share most of their
/// subtrees, so the store is read once, not once per version.
type SubtreeMemo = std::collections::HashMap<u64, (u64, u64)>;

fn identity(child: &Child) -> u64 {
    match child.disk_ref() {
        Some(r) => r.addr.0,
        // In-memory addresses are below 2^63 on every platform we run on; written
        // addresses of such magnitude would need a segment id of 2^23.
        None => match child {
            Child::Mem(n) => (Arc::as_ptr(n) as usize as u64) | (1 << 63),
            Child::Disk(_) => unreachable!("a Disk child has an address"),
        },
    }
}

/// Bytes of the nodes and extents reachable from `child`, and the keys in it. Within
/// one tree nothing is reachable twice (an extent belongs to one leaf of a version).
fn referenced(
    loader: Loader<'_>,
    child: &Child,
    memo: &mut SubtreeMemo,
    depth: usize,
) -> Result<(u64, u64)> {
    if depth > crate::btree::node::MAX_DEPTH {
        return Err(Error::corrupted("node", "tree deeper than MAX_DEPTH"));
    }
    let id = identity(child);
    if let Some(&totals) = memo.get(&id) {
        return Ok(totals);
    }
    let node = loader.resolve(child)?;
    let mut bytes = child
        .disk_ref()
        .map_or(node.size as u64, |r| u64::from(r.len));
    let mut keys = 0;
    match &node.body {
        Body::Leaf(entries) => {
            keys += entries.len() as u64;
            for e in entries {
                if let Value::Extent(r) = e.value {
                    bytes += u64::from(r.len);
                }
            }
        }
        Body::Branch(entries) => {
            for e in entries {
                let (b, k) = referenced(loader, &e.child, memo, depth + 1)?;
                bytes += b;
                keys += k;
            }
        }
    }
    memo.insert(id, (bytes, keys));
    Ok((bytes, keys))
}

/// Bytes that dropping the version at `root` would free: Rodeh's drop walk, run on a
/// scratch copy of the counts. A node is counted when its last parent goes.
fn exclusive(loader: Loader<'_>, refs: &RefCounts, root: &Child) -> Result<u64> {
    let mut rc = RcDelta::default();
    let mut bytes = 0;
    // Each child carries its parent's level, and `child_of` checks that the level
    // drops by one per step: a damaged tree cannot make this walk loop.
    let mut stack: Vec<(Child, Option<u8>)> = vec![(root.clone(), None)];
    while let Some((child, parent_level)) = stack.pop() {
        let t = refs.target(&child);
        if rc.count(refs, &t) > 1 {
            rc.add(&t, -1);
            continue;
        }
        let node = match parent_level {
            None => loader.resolve(&child)?,
            Some(level) => loader.child_of(level, &child)?,
        };
        bytes += child
            .disk_ref()
            .map_or(node.size as u64, |r| u64::from(r.len));
        match &node.body {
            Body::Branch(entries) => {
                stack.extend(entries.iter().map(|e| (e.child.clone(), Some(node.level))))
            }
            Body::Leaf(entries) => {
                for e in entries {
                    if let Value::Extent(r) = e.value {
                        let t = Target::Block(r);
                        if rc.count(refs, &t) > 1 {
                            rc.add(&t, -1);
                        } else {
                            bytes += u64::from(r.len);
                        }
                    }
                }
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["main", "snap-1", "v1.2", "ci/run_7", "A"] {
            assert!(check_version_name(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(256);
        for bad in [
            "",
            "-x",
            ".hidden",
            "..",
            "a b",
            "tab\t",
            "é",
            long.as_str(),
        ] {
            assert!(
                matches!(check_version_name(bad), Err(Error::InvalidVersionName(_))),
                "{bad:?}"
            );
        }
    }
}
