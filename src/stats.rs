//! `Store::stats`: sizes, node counts, depth, segments, live and dead bytes, cache
//! hit rate and WAL size, as one plain struct (serialisable for `--json`).

use crate::btree::node::Node;
use crate::btree::walk::{walk, At, ReadAhead, Visitor};
use crate::catalog::MAIN_BRANCH;
use crate::engine::Shared;
use crate::error::Result;
use crate::format::FORMAT_VERSION;
use crate::sync::lock;
use crate::wal;
use serde::Serialize;
use std::sync::Arc;

/// A point-in-time summary of a store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// On-disk format version.
    pub format_version: u32,
    /// Superblock generation: how many checkpoints the store has made durable.
    pub generation: u64,
    /// The last LSN included in the durable checkpoint.
    pub checkpoint_lsn: u64,
    /// The last committed LSN (checkpointed or only in the WAL).
    pub last_lsn: u64,
    /// Number of versions (branches and snapshots) in the catalog.
    pub versions: u64,
    /// Whether the store has a `main` branch (a store made by an older build could
    /// have dropped it); the `main` figures below are zero without one.
    pub main_exists: bool,
    /// Keys in the `main` branch.
    pub keys: u64,
    /// Height of `main`'s tree (0 for an empty tree, 1 for a lone leaf).
    pub depth: u32,
    /// Leaf nodes in `main`'s tree.
    pub leaf_nodes: u64,
    /// Branch (interior) nodes in `main`'s tree.
    pub branch_nodes: u64,
    /// Values stored out of line, in extents of their own, in `main`.
    pub extents: u64,
    /// Bytes of those extents.
    pub extent_bytes: u64,
    /// Nodes changed in memory since the last checkpoint (not yet written).
    pub dirty_nodes: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes in all segment files.
    pub segment_bytes: u64,
    /// Bytes in segments still referenced by the durable state.
    pub live_bytes: u64,
    /// Bytes in segments that are not live blocks: blocks no longer referenced, and
    /// the metadata and back-reference run blobs (the current ones too: they are not
    /// counted as live). Reclaimed when a segment empties.
    pub dead_bytes: u64,
    /// Blocks (nodes and value extents) shared by more than one parent, i.e. between
    /// versions: the entries of the reference-count table.
    pub shared_blocks: u64,
    /// Nodes of dropped versions still waiting to be freed by the background walk.
    pub drop_pending_nodes: u64,
    /// Bytes of write-ahead log not yet covered by a checkpoint.
    pub wal_bytes: u64,
    /// WAL files on disk.
    pub wal_files: u64,
    /// Bytes of the retired log file kept for the next generation to reuse
    /// (`wal-spare.log`; cut back to 4 MiB at each checkpoint).
    pub wal_spare_bytes: u64,
    /// Bytes of the spare data segment files held: emptied segments kept for the
    /// data stream to write over (`spare-*.dat`; see `Options::keep_spares_at_close`).
    pub spare_bytes: u64,
    /// Page cache budget in bytes.
    pub cache_capacity_bytes: u64,
    /// Bytes of nodes held in the page cache.
    pub cache_bytes: u64,
    /// Page cache hits since open.
    pub cache_hits: u64,
    /// Page cache misses (node reads from disk) since open.
    pub cache_misses: u64,
    /// hits / (hits + misses), 0 when there were no lookups.
    pub cache_hit_rate: f64,
    /// Bytes of every file of the store on disk (segments, WAL, superblock, reserve):
    /// what `clean` and `shrink` bring down towards `live_bytes`.
    pub footprint_bytes: u64,
    /// Bytes of metadata the last checkpoint of this process wrote (one blob: a delta
    /// of what changed, or now and then a new base); 0 before the first.
    pub meta_bytes_last_checkpoint: u64,
    /// Back-reference records on disk (`From` and `To`, in every run).
    pub backref_records: u64,
    /// Back-reference runs (one per checkpoint until compaction merges them).
    pub backref_runs: u64,
    /// Bytes of the current back-reference runs (blobs in the segments, part of
    /// `dead_bytes`).
    pub backref_bytes: u64,
    /// Nanoseconds spent on back references since open: recording edges (as nodes are
    /// written and freed), writing runs and compacting them. Up to the last
    /// checkpoint; what it costs the writer.
    pub backref_nanos: u64,
    /// Bytes of back-reference runs written since open (each checkpoint's level-0
    /// run, and compactions).
    pub backref_written_bytes: u64,
    /// Records in the runs written since open.
    pub backref_written_records: u64,
    /// Compactions of the back references since open.
    pub backref_compactions: u64,
    /// Version operations (snapshots, clones, new branches) the cleaner ran for
    /// their callers while it held the writer lock, since open: each would otherwise
    /// have waited for the rest of a cleaner round.
    pub version_ops_lent: u64,
}

pub(crate) fn collect(shared: &Shared) -> Result<Stats> {
    let view = shared.published();
    let (shared_blocks, drop_pending) = {
        let w = shared.lock_writer();
        (w.refs.shared_blocks() as u64, w.drop_queue.len() as u64)
    };
    let (generation, checkpoint_lsn, usage, meta_bytes_last) = {
        let d = lock(&shared.durable);
        (
            d.sb.generation,
            d.sb.checkpoint_lsn,
            d.meta.usage.clone(),
            d.meta_bytes_last,
        )
    };
    let mut s = Stats {
        format_version: FORMAT_VERSION,
        generation,
        checkpoint_lsn: checkpoint_lsn.0,
        last_lsn: view.lsn.0,
        versions: view.versions.len() as u64,
        shared_blocks,
        drop_pending_nodes: drop_pending,
        meta_bytes_last_checkpoint: meta_bytes_last,
        ..Stats::default()
    };
    if let Some(main) = view.versions.iter().find(|v| &*v.name == MAIN_BRANCH) {
        s.main_exists = true;
        if let Some(root) = &main.root {
            walk(
                &mut ReadAhead(shared.loader()),
                root,
                &mut TreeStats(&mut s),
            )?;
        }
    }
    let sizes = shared.segments.sizes()?;
    s.segments = sizes.len() as u64;
    s.segment_bytes = sizes.iter().map(|(_, n)| n).sum();
    s.live_bytes = usage.values().sum();
    s.dead_bytes = s.segment_bytes.saturating_sub(s.live_bytes);
    s.wal_files = wal::generations(&*shared.vfs, 0)?.len() as u64;
    s.wal_bytes = shared.wal.bytes_since_checkpoint();
    s.wal_spare_bytes = wal::spare_bytes(&*shared.vfs)?;
    s.spare_bytes = shared.segments.spare_bytes();
    s.footprint_bytes = crate::clean::footprint(shared)?;
    {
        let b = lock(&shared.backrefs);
        s.backref_records = b.record_count();
        s.backref_runs = b.run_count() as u64;
        s.backref_bytes = b.bytes_on_disk();
        s.backref_nanos = u64::try_from(b.time_spent().as_nanos()).unwrap_or(u64::MAX);
        let written = b.written();
        s.backref_written_bytes = written.bytes;
        s.backref_written_records = written.records;
        s.backref_compactions = written.compactions;
    }
    s.version_ops_lent = shared.lender.lent();
    s.cache_capacity_bytes = shared.cache.capacity();
    s.cache_bytes = shared.cache.bytes();
    s.cache_hits = shared.cache.hits();
    s.cache_misses = shared.cache.misses();
    let lookups = s.cache_hits + s.cache_misses;
    #[expect(clippy::cast_precision_loss, reason = "a ratio for people")]
    if lookups > 0 {
        s.cache_hit_rate = s.cache_hits as f64 / lookups as f64;
    }
    Ok(s)
}

/// Counts `main`'s nodes, keys and extents into `s`.
struct TreeStats<'s>(&'s mut Stats);

impl Visitor for TreeStats<'_> {
    fn visit(&mut self, _at: &At<'_>, node: &Arc<Node>) -> Result<bool> {
        let s = &mut *self.0;
        if node.is_dirty() {
            s.dirty_nodes += 1;
        }
        s.depth = s.depth.max(u32::from(node.level) + 1);
        if node.is_leaf() {
            s.leaf_nodes += 1;
            s.keys += node.len() as u64;
            for (_, x) in node.extents() {
                s.extents += 1;
                s.extent_bytes += u64::from(x.len);
            }
        } else {
            s.branch_nodes += 1;
        }
        Ok(true)
    }
}
