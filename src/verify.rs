//! `verify`, the fsck, and `stats`.
//!
//! `verify` re-reads the durable state from disk, bypassing the page cache: the
//! newest valid superblock (and reports an invalid other slot), the metadata blob,
//! every node of every version (checksum from the parent, self-checksum, structure,
//! key order, key bounds against the parent's separators, levels, sizes), every value
//! extent (checksum), then recomputes reference counts and per-segment live bytes from
//! the walk and compares them with the stored tables. Finally it reads the WAL past
//! the checkpoint and checks every record's framing, checksum, LSN continuity and
//! payload structure. Every finding is a line in `problems`; it never stops at the
//! first one unless the structure to walk is gone.

use crate::btree::node::{Body, Child, Node, Value, BRANCH_ENTRY_MAX, LEAF_ENTRY_MAX, NODE_MAX};
use crate::catalog::Meta;
use crate::engine::Shared;
use crate::error::Result;
use crate::format::FORMAT_VERSION;
use crate::format::{Addr, BlockRef, Lsn, SegmentId};
use crate::io::Vfs;
use crate::space::{Segments, Usage};
use crate::superblock::{Slot, SuperblockFile};
use crate::wal::{self, Generations, Record};
use serde::Serialize;
use std::collections::BTreeMap;

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

    /// Checks the subtree at `r`, whose keys must lie in `[lo, hi)`.
    fn node(
        &mut self,
        version: &str,
        r: BlockRef,
        level: Option<u8>,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        is_root: bool,
    ) {
        if !self.reference(r) {
            return; // shared subtree, already checked
        }
        let node = match self
            .segments
            .read(r, "node")
            .and_then(|b| Node::decode(&b, r))
        {
            Ok(n) => n,
            Err(e) => return self.problem(format!("{version}: node {:?}: {e}", r.addr)),
        };
        self.report.nodes += 1;
        self.report.bytes += u64::from(r.len);
        (self.progress)(self.report.bytes);
        if let Some(l) = level {
            if node.level != l {
                self.problem(format!(
                    "{version}: node {:?} at level {} where {} was expected",
                    r.addr, node.level, l
                ));
            }
        }
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
        let keys: Vec<&[u8]> = match &node.body {
            Body::Leaf(e) => e.iter().map(|e| &*e.key).collect(),
            Body::Branch(e) => e.iter().map(|e| &*e.key).collect(),
        };
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            self.problem(format!("{version}: node {:?} keys out of order", r.addr));
        }
        let first_ok = match (lo, keys.first()) {
            (Some(lo), Some(first)) => *first >= lo,
            _ => true,
        };
        let last_ok = match (hi, keys.last()) {
            (Some(hi), Some(last)) => *last < hi,
            _ => true,
        };
        if !first_ok || !last_ok {
            self.problem(format!(
                "{version}: node {:?} has keys outside its parent's bounds",
                r.addr
            ));
        }
        if keys.is_empty() && is_root {
            self.problem(format!("{version}: empty root node {:?}", r.addr));
        }
        match &node.body {
            Body::Leaf(entries) => {
                self.report.keys += entries.len() as u64;
                for e in entries {
                    if let Value::Extent(x) = e.value {
                        self.extent(version, x);
                    }
                }
            }
            Body::Branch(entries) => {
                for (i, e) in entries.iter().enumerate() {
                    let Child::Disk(c) = e.child else {
                        unreachable!("decoded children are on disk")
                    };
                    let child_lo = if i == 0 {
                        lo.map(<[u8]>::to_vec)
                    } else {
                        Some(e.key.to_vec())
                    };
                    let child_hi = entries
                        .get(i + 1)
                        .map(|n| n.key.to_vec())
                        .or_else(|| hi.map(<[u8]>::to_vec));
                    self.node(
                        version,
                        c,
                        Some(node.level - 1),
                        child_lo.as_deref(),
                        child_hi.as_deref(),
                        false,
                    );
                }
            }
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

pub(crate) fn verify(shared: &Shared, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
    let vfs = &*shared.vfs;
    let sb_file = SuperblockFile::read(vfs, &shared.label)?;
    let segments = Segments::open(shared.vfs.clone(), true)?;
    let mut walker = Walker {
        segments: &segments,
        report: VerifyReport::default(),
        refs: BTreeMap::new(),
        usage: Usage::new(),
        progress,
    };
    for (i, slot) in sb_file.slots.iter().enumerate() {
        match slot {
            Slot::Valid(_) => {}
            Slot::Invalid(why) => walker.problem(format!("superblock slot {i} is invalid: {why}")),
            Slot::OtherVersion(v) => walker.problem(format!(
                "superblock slot {i} has format version {v}, expected {FORMAT_VERSION}"
            )),
        }
    }
    let Some(sb) = sb_file.candidates()?.into_iter().next() else {
        unreachable!("candidates is never empty")
    };
    let meta = match segments
        .read(sb.meta, "metadata")
        .and_then(|b| Meta::decode(&b))
    {
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
            walker.node(&v.name, *r, None, None, None, true);
        }
    }
    // Nodes of dropped versions not yet freed still hold their bytes and their
    // children's references: they are roots of the walk too.
    for r in &meta.drop_queue {
        walker.node("(dropped)", *r, None, None, None, false);
    }
    check_tables(&mut walker, &meta, &segments)?;
    check_wal(&mut walker, vfs, sb.wal_gen, sb.checkpoint_lsn)?;
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

/// Checks every WAL record past the checkpoint: framing, checksum, LSN continuity
/// across generations, and payload structure.
fn check_wal(
    walker: &mut Walker<'_>,
    vfs: &dyn Vfs,
    first_gen: u64,
    checkpoint_lsn: Lsn,
) -> Result<()> {
    for generation in Generations::read(vfs, first_gen, checkpoint_lsn)? {
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
    }
    Ok(())
}
