//! `Store::stats`: sizes, node counts, depth, segments, live and dead bytes, cache
//! hit rate and WAL size, as one plain struct (serialisable for `--json`).

use serde::Serialize;

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
    /// Bytes in segments no longer referenced (reclaimed when a segment empties).
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
}
