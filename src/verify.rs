//! `verify`, the fsck, and `stats`.
//!
//! `verify` re-reads the durable state from disk, bypassing the page cache: the
//! newest valid superblock (and reports an invalid other slot), the files named like
//! segments that are not (strays, which the store ignores), the metadata chain
//! (every blob back to its base, the deltas applied),
//! every node of every version (checksum from the parent, self-checksum, structure,
//! key order, key bounds against the parent's separators, levels, sizes), every value
//! extent (checksum), then recomputes reference counts and per-segment live bytes from
//! the walk and compares them with the stored tables. Finally it reads the WAL past
//! the checkpoint and checks every record's framing, checksum, LSN continuity and
//! payload structure. Every finding is a line in `problems`; it never stops at the
//! first one unless the structure to walk is gone.

use crate::backref::{BackrefStore, Edge, WriteStore};
use crate::btree::node::{Child, ChildRef, Node, BRANCH_ENTRY_MAX, LEAF_ENTRY_MAX, NODE_MAX};
use crate::btree::node_children;
use crate::btree::walk::{walk, At, Source, Visitor};
use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::format::{Addr, BlockRef, SegmentId};
use crate::meta::{self, Meta};
use crate::space::{Segments, Usage};
use crate::superblock::{read_between_checkpoints, Slot, SuperblockFile};
use crate::wal::{self, Generations, Record};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Versions walked.
    pub versions: u64,
    /// Tree nodes read and checked.
    pub nodes: u64,
    /// Out-of-line value extents read and checked.
    pub extents: u64,
    /// Keys seen (summed over versions).
    pub keys: u64,
    /// Bytes read and checksummed.
    pub bytes: u64,
    /// Valid WAL records past the checkpoint.
    pub wal_records: u64,
    /// Whether the WAL ended in a torn (ignored) record.
    pub wal_torn_tail: bool,
    /// Every problem found; empty means the store is clean.
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// True when no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Walker<'a> {
    segments: &'a Segments,
    report: VerifyReport,
    /// Times each block is referenced by the walk.
    refs: BTreeMap<Addr, (u32, u32)>,
    usage: Usage,
    /// Every pointer of every written node walked: the back references there must be.
    edges: Vec<Edge>,
    progress: &'a mut dyn FnMut(u64),
}

impl Walker<'_> {
    fn problem(&mut self, p: String) {
        self.report.problems.push(p);
    }

    fn reference(&mut self, r: BlockRef) -> bool {
        let e = self.refs.entry(r.addr).or_insert((0, r.len));
        e.0 += 1;
        let (count, len) = *e;
        if len != r.len {
            self.problem(format!(
                "block {:?} referenced with lengths {len} and {}",
                r.addr, r.len
            ));
        }
        if count == 1 {
            *self.usage.entry(r.addr.segment()).or_default() += u64::from(r.len);
            true
        } else {
            false
        }
    }

    /// Checks the tree of `version` at `root`, every node read from disk (not the
    /// cache) and checked against its parent. `is_version_root`: a version's root
    /// must not be empty (a drop-queue entry may be any node).
    fn tree(&mut self, version: &str, root: BlockRef, is_version_root: bool) {
        let mut source = DiskReads(self.segments);
        let mut visitor = TreeCheck {
            walker: self,
            version,
            is_version_root,
        };
        if let Err(e) = walk(&mut source, &Child::Disk(root), &mut visitor) {
            self.problem(format!("{version}: {e}"));
        }
    }

    /// Checks one node's own structure: size bound, key order, keys within the
    /// parent's separators.
    fn check_node(&mut self, version: &str, at: &At<'_>, r: BlockRef, node: &Node) {
        // Bounds are soft, in bytes: a node splits at its middle when an insert would
        // push it past NODE_MAX, and the half that takes the new entry may then end
        // up to two maximal entries past the middle... and past NODE_MAX, when entries
        // are kilobytes (long keys, values near the inline limit).
        let limit = if node.level == 0 {
            NODE_MAX + 2 * LEAF_ENTRY_MAX
        } else {
            NODE_MAX + 2 * BRANCH_ENTRY_MAX
        };
        if node.size > limit && node.len() > 1 {
            self.problem(format!(
                "{version}: node {:?} is {} bytes, over the {limit}-byte bound",
                r.addr, node.size
            ));
        }
        let keys: Vec<&[u8]> = node.keys().collect();
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            self.problem(format!("{version}: node {:?} keys out of order", r.addr));
        }
        let first_ok = match (at.lo, keys.first()) {
            (Some(lo), Some(first)) => *first >= lo,
            _ => true,
        };
        let last_ok = match (at.hi, keys.last()) {
            (Some(hi), Some(last)) => *last < hi,
            _ => true,
        };
        if !first_ok || !last_ok {
            self.problem(format!(
                "{version}: node {:?} has keys outside its parent's bounds",
                r.addr
            ));
        }
    }

    fn extent(&mut self, version: &str, x: BlockRef) {
        if !self.reference(x) {
            return;
        }
        match self.segments.read(x, "extent") {
            Ok(_) => {
                self.report.extents += 1;
                self.report.bytes += u64::from(x.len);
            }
            Err(e) => self.problem(format!("{version}: extent {:?}: {e}", x.addr)),
        }
    }
}

/// Reads nodes straight from their segments, bypassing the page cache, so every
/// node's checksum is checked against its parent's reference.
struct DiskReads<'a>(&'a Segments);

impl Source for DiskReads<'_> {
    fn node(&mut self, child: &Child) -> Result<Arc<Node>> {
        let Child::Disk(r) = child else {
            return Err(Error::corrupted("node", "in-memory node in a durable tree"));
        };
        let bytes = self.0.read(*r, "node")?;
        Ok(Arc::new(Node::decode(bytes, *r)?))
    }

    fn children_ahead(&mut self, branch: &Node) {
        let children = (0..branch.len()).filter_map(|i| match branch.child(i) {
            ChildRef::Disk(r) => Some((r.addr, r.len)),
            ChildRef::Mem(_) => None,
        });
        self.0.will_need_blocks(children);
    }
}

/// One version's tree walk, reporting into the walker.
struct TreeCheck<'w, 'a> {
    walker: &'w mut Walker<'a>,
    version: &'w str,
    is_version_root: bool,
}

impl Visitor for TreeCheck<'_, '_> {
    fn enter(&mut self, at: &At<'_>) -> Result<bool> {
        // A block seen before is a shared subtree, already checked.
        Ok(at
            .child
            .disk_ref()
            .is_some_and(|r| self.walker.reference(r)))
    }

    fn visit(&mut self, at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        let Some(r) = at.child.disk_ref() else {
            return Ok(false);
        };
        let w = &mut *self.walker;
        w.report.nodes += 1;
        w.report.bytes += u64::from(r.len);
        (w.progress)(w.report.bytes);
        w.check_node(self.version, at, r, node);
        w.edges.extend(node_children(node).map(|child| Edge {
            child: child.addr,
            parent: r.addr,
            len: child.len,
        }));
        if at.depth == 0 && self.is_version_root && node.len() == 0 {
            w.problem(format!("{}: empty root node {:?}", self.version, r.addr));
        }
        if node.is_leaf() {
            w.report.keys += node.len() as u64;
            for (_, x) in node.extents() {
                w.extent(self.version, x);
            }
        }
        Ok(true)
    }

    fn damaged(&mut self, at: &At<'_>, err: Error) -> Result<()> {
        let problem = match at.child.disk_ref() {
            Some(r) => format!("{}: node {:?}: {err}", self.version, r.addr),
            None => format!("{}: {err}", self.version),
        };
        self.walker.problem(problem);
        Ok(())
    }
}

/// What `verify` reads of the durable state before it checks anything: the files it
/// will walk held open, and everything a checkpoint could delete or recycle (the
/// back-reference runs, the log) read into memory.
struct Durable {
    sb_file: SuperblockFile,
    segments: Segments,
    /// The newest valid superblock and its metadata (or why there is none).
    state: Result<(crate::superblock::Superblock, Result<Meta>)>,
    /// The stored back references (or why they cannot be read).
    backrefs: Result<Vec<Edge>>,
    /// The log past the checkpoint, generation by generation.
    wal: Vec<Result<wal::Generation>>,
}

impl Durable {
    fn read(shared: &Shared) -> Result<Durable> {
        let vfs = &*shared.vfs;
        let sb_file = SuperblockFile::read(vfs, &shared.label)?;
        let segments = Segments::open(shared.vfs.clone(), true)?;
        let state = sb_file.candidates().and_then(|c| {
            let sb = c
                .into_iter()
                .next()
                .ok_or_else(|| Error::corrupted("superblock", "no valid slot"))?;
            Ok((sb, meta::chain::load(&segments, sb.meta).map(|(m, _)| m)))
        });
        let mut backrefs = Ok(Vec::new());
        let mut wal = Vec::new();
        if let Ok((sb, Ok(meta))) = &state {
            let manifest = &meta.backref_manifest;
            backrefs = BackrefStore::open(&segments, (!manifest.is_empty()).then_some(manifest))
                .map(|store| store.live_edges(&WriteStore::default()));
            wal = Generations::read(vfs, sb.wal_gen, sb.checkpoint_lsn)?.collect();
        }
        Ok(Durable {
            sb_file,
            segments,
            state,
            backrefs,
            wal,
        })
    }
}

/// Checks the store. A writer in another process may checkpoint meanwhile (deleting
/// segments and log files, recycling a log file): everything is read first, then the
/// superblock again, and the reading starts over if a checkpoint landed; the checks
/// then run on what was read (the segments through the handles opened, which stay
/// readable after a deletion).
pub(crate) fn verify(shared: &Shared, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
    let durable = read_between_checkpoints(&*shared.vfs, &shared.label, || Durable::read(shared))??;
    check(durable, progress)
}

fn check(durable: Durable, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
    let Durable {
        sb_file,
        segments,
        state,
        backrefs,
        wal,
    } = durable;
    let mut walker = Walker {
        segments: &segments,
        report: VerifyReport::default(),
        refs: BTreeMap::new(),
        usage: Usage::new(),
        edges: Vec::new(),
        progress,
    };
    for (id, why) in segments.strays() {
        walker.problem(format!(
            "{} is not a segment of this store: {why}; ignored (never read, written or \
             deleted; move it out of the store directory)",
            id.file_name()
        ));
    }
    for (i, slot) in sb_file.slots.iter().enumerate() {
        match slot {
            Slot::Valid(_) => {}
            Slot::Invalid(why) => walker.problem(format!("superblock slot {i} is invalid: {why}")),
            Slot::OtherVersion(v) => walker.problem(format!(
                "superblock slot {i} has format version {v}, expected {FORMAT_VERSION}"
            )),
        }
    }
    let (sb, meta) = state?;
    // The metadata is rebuilt from its whole chain: a damaged blob anywhere in it is
    // damage to the durable state.
    let meta = match meta {
        Ok(m) => m,
        Err(e) => {
            walker.problem(format!(
                "metadata of superblock generation {}: {e}",
                sb.generation
            ));
            return Ok(walker.report);
        }
    };
    for v in &meta.catalog.versions {
        walker.report.versions += 1;
        if let Some(Child::Disk(r)) = &v.root {
            walker.tree(&v.name, *r, true);
        }
    }
    // Nodes of dropped versions not yet freed still hold their bytes and their
    // children's references: they are roots of the walk too.
    for r in &meta.drop_queue {
        walker.tree("(dropped)", *r, false);
    }
    check_tables(&mut walker, &meta, &segments)?;
    check_backrefs(&mut walker, backrefs);
    check_wal(&mut walker, wal);
    Ok(walker.report)
}

fn check_tables(walker: &mut Walker<'_>, meta: &Meta, segments: &Segments) -> Result<()> {
    let refs: Vec<(Addr, u32)> = walker.refs.iter().map(|(a, (n, _))| (*a, *n)).collect();
    for (addr, n) in refs {
        let stored = meta.refcounts.get(&addr).copied().unwrap_or(1);
        if stored != n {
            walker.problem(format!(
                "block {addr:?}: reference count {stored} stored, {n} found"
            ));
        }
    }
    for (addr, stored) in &meta.refcounts {
        if !walker.refs.contains_key(addr) {
            walker.problem(format!(
                "block {addr:?}: reference count {stored} stored for an unreferenced block"
            ));
        }
    }
    let sizes: BTreeMap<SegmentId, u64> = segments.sizes()?.into_iter().collect();
    let mut all: Vec<SegmentId> = meta
        .usage
        .keys()
        .chain(walker.usage.keys())
        .copied()
        .collect();
    all.sort();
    all.dedup();
    for seg in all {
        let stored = meta.usage.get(&seg).copied().unwrap_or(0);
        let found = walker.usage.get(&seg).copied().unwrap_or(0);
        if stored != found {
            walker.problem(format!(
                "{}: {stored} live bytes stored, {found} found by the walk",
                seg.file_name()
            ));
        }
        if found > 0 && !sizes.contains_key(&seg) {
            walker.problem(format!("{} is referenced but missing", seg.file_name()));
        }
    }
    Ok(())
}

/// Rebuilds the back references from the walk and compares them with the stored
/// ones (Backlog's own check): every pointer of a written node is a live back
/// reference, and there is no other.
fn check_backrefs(walker: &mut Walker<'_>, stored: Result<Vec<Edge>>) {
    let stored = match stored {
        Ok(edges) => edges,
        Err(e) => {
            walker.problem(format!("back references: {e}"));
            return;
        }
    };
    let mut found = std::mem::take(&mut walker.edges);
    found.sort();
    found.dedup();
    let stored: BTreeSet<(Addr, Addr, u32)> =
        stored.iter().map(|e| (e.child, e.parent, e.len)).collect();
    let found: BTreeSet<(Addr, Addr, u32)> =
        found.iter().map(|e| (e.child, e.parent, e.len)).collect();
    let missing = found.difference(&stored).count();
    let extra = stored.difference(&found).count();
    let mut report = |what: &str, n: usize, example: Option<&(Addr, Addr, u32)>| {
        if let Some((child, parent, _)) = example {
            walker.problem(format!(
                "back references: {n} {what} (e.g. {child:?} <- {parent:?})"
            ));
        }
    };
    report(
        "pointers have no stored back reference",
        missing,
        found.difference(&stored).next(),
    );
    report(
        "stored back references match no pointer",
        extra,
        stored.difference(&found).next(),
    );
}

/// Checks every WAL record past the checkpoint: framing, checksum, LSN continuity
/// across generations, and payload structure (values records' too).
fn check_wal(walker: &mut Walker<'_>, generations: Vec<Result<wal::Generation>>) {
    for generation in generations {
        let generation = match generation {
            Ok(g) => g,
            Err(e) => {
                walker.problem(e.to_string());
                continue;
            }
        };
        walker.report.wal_torn_tail |= generation.torn_tail;
        for logged in &generation.records {
            walker.report.wal_records += 1;
            let name = wal::file_name(generation.gen);
            match logged.record() {
                Ok(Record::CheckpointCommit { .. }) => walker.problem(format!(
                    "{name}: LSN {} was committed by a newer checkpoint than the superblock in use",
                    logged.lsn.0
                )),
                Ok(_) => {}
                Err(e) => walker.problem(format!("{name}: {e}")),
            }
        }
        for logged in &generation.values {
            if let Err(e) = wal::decode_values(&logged.payload) {
                let name = wal::file_name(generation.gen);
                walker.problem(format!(
                    "{name}: values record after LSN {}: {e}",
                    logged.lsn.0
                ));
            }
        }
    }
}
