//! Back references: for every block, which written tree nodes point at it.
//!
//! This is Backlog (Macko et al., FAST '10, §4–§5) adapted to cambium's physical
//! model. A back reference is an **edge** `parent → child`: the tree node written at
//! address `parent` holds a pointer to the block at `child` (a tree node or an
//! out-of-line value extent). Relocation (segment cleaning) asks "who points at the
//! blocks in this address range?" and `verify` compares the live edge set with a walk
//! of every tree.
//!
//! The store is a small LSM of two record kinds kept in one sorted order
//! `(child, parent)`:
//!
//! - `From { child, len, parent, gen }`: the checkpoint of generation `gen` wrote
//!   `parent`, which points at `child` (a block of `len` bytes);
//! - `To { child, parent, gen }`: `parent` was freed in the interval that checkpoint
//!   `gen` persists.
//!
//! An edge is **live** iff it has a `From`, has no `To`, and neither its child's nor
//! its parent's segment is in the **deletion vector** (segments whose blocks are all
//! relocated or freed and whose file is deleted).
//!
//! The pieces, bottom up:
//!
//! - [`WriteStore`] (`write_store.rs`): the in-memory records of one interval between
//!   checkpoints, a plain value the engine owns. Removing an edge added in the same
//!   write store cancels both (Backlog's same-interval pruning); a transaction keeps
//!   its own `WriteStore` and `merge`s it in at commit (or drops it on abort).
//! - `Run` (`run.rs`): the immutable, sorted records one checkpoint (or a compaction)
//!   wrote, appended as one or more blobs to the data segments (like the metadata
//!   chain's blobs, so the checkpoint's segment sync makes them durable: no file and
//!   no directory fsync of their own), with a Bloom filter over child addresses
//!   (`bloom.rs`) for point queries and min/max child fences for range queries. Runs
//!   are held decoded in memory, with a sparse index (every 64th child) so a lookup
//!   touches few cache lines; queries merge-join the runs and the write store.
//! - `Manifest` (`manifest.rs`): the durable description of the store (its runs with
//!   their checksums and the blobs holding them, the deletion vector, the next run
//!   number). The engine embeds its bytes in the checkpoint metadata.
//! - [`BackrefStore`] (`store.rs`): the runs, the deletion vector, persistence,
//!   compaction and the queries.
//!
//! Invariants:
//!
//! 1. Addresses are never reused, so an edge is added at most once and, once removed,
//!    never comes back. Hence every edge has at most one `From` and at most one `To`,
//!    and its `To` is in the same or a later run than its `From`.
//! 2. Within one run, keys `(child, parent)` are strictly increasing (unique).
//! 3. Runs are ordered oldest first by `seq`; run numbers are never reused by a
//!    manifest that could still be read (a new run always takes `next_seq`).
//! 4. A run blob named by a manifest is never modified or removed while that manifest
//!    may still be read: `persist` only appends new blobs (segments are append-only),
//!    and the engine never deletes a segment holding a blob of a run either superblock
//!    slot's manifest names (`run_segments`); to free such a segment it has `persist`
//!    compact, which moves the runs to new blobs elsewhere. So a crash at any point of
//!    `persist` leaves every earlier manifest fully readable.
//! 5. The blobs `persist` appends are durable before anything durable names the
//!    manifest that names them: the engine syncs the segments before it writes the
//!    superblock that embeds the manifest.
//! 6. After `delete_segment(s)`, no edge naming `s` is added (its blocks are gone).
//!    The engine calls it only once the removal of `s`'s file is durable: a file a
//!    power loss brought back could take appends again (the newest segment of its
//!    kind is where appends resume), and the vector would hide their edges.
//!    Records naming `s` are dead at once; compaction purges them and then drops `s`
//!    from the deletion vector, since no run mentions it any more. (It keeps filtering
//!    in memory until the store is reopened, in case a write store frozen later still
//!    holds a record from before the deletion.)
//!
//! Version roots are not edges (the catalog knows them), so a clone adds no records
//! (structural inheritance for free), and a dropped version's nodes stay parents until
//! their space is freed (zombies for free).

mod bloom;
mod manifest;
mod record;
mod run;
mod store;
mod write_store;

#[cfg(test)]
mod tests;

pub(crate) use record::Edge;
pub(crate) use store::MAX_RUNS;
pub(crate) use store::{run_segments, BackrefStore};
pub(crate) use write_store::WriteStore;

/// Whether `name` is a back-reference run file of an older layout (runs were files
/// before they were blobs in the segments).
pub(crate) fn is_run_file_name(name: &str) -> bool {
    run::parse_file_name(name).is_some()
}
