//! The metadata a checkpoint records besides the tree nodes, and how it grows with
//! change instead of with the store: a **base** blob holds all of it, each later
//! checkpoint appends a **delta** blob holding only what changed, and the superblock
//! names the newest blob. The blobs form a chain, newest to oldest, back to the base.
//!
//! - [`Meta`] is the metadata itself (catalog, live bytes per segment, reference counts
//!   above one, drop queue, segments waiting for deletion, the back-reference
//!   manifest). [`MetaDelta`] is what one checkpoint changed; [`Meta::apply`] folds
//!   it in.
//! - `codec` reads and writes both blob kinds (untrusted bytes: typed errors only).
//! - `chain` loads a chain at open (bounded, checked link by link) and decides when a
//!   checkpoint writes a new base: when the deltas since the base add up to more than
//!   the base, or the chain reaches [`chain::MAX_CHAIN_BLOBS`]. So a checkpoint writes
//!   O(change) bytes amortised, and an open reads at most about twice the base.
//!
//! Invariant: applying a chain's deltas in order to its base gives exactly the
//! metadata a full blob written by the same checkpoint would have held (`verify`
//! recomputes counts and live bytes from a walk and compares).

pub(crate) mod chain;
#[cfg(test)]
use chain::MAX_CHAIN_BLOBS;
mod codec;

pub(crate) use chain::Chain;

use crate::catalog::{same_entry, Catalog, Version, VersionId};
use crate::error::{Error, Result};
use crate::format::{Addr, BlockRef, SegmentId};
use crate::space::Usage;
use std::collections::BTreeMap;

/// A segment emptied by a durable checkpoint, waiting to be deleted once neither
/// superblock slot can reach it (persisted so that a later process deletes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingSegment {
    pub segment: SegmentId,
    /// The superblock generation that emptied it.
    pub generation: u64,
}

/// Everything a checkpoint records besides the tree nodes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meta {
    pub catalog: Catalog,
    pub usage: Usage,
    pub refcounts: BTreeMap<Addr, u32>,
    /// Unreferenced nodes of dropped versions not yet freed (see `refcount`).
    pub drop_queue: Vec<BlockRef>,
    /// Segments emptied by a checkpoint and not yet deleted.
    pub pending_deletes: Vec<PendingSegment>,
    /// Opaque bytes of the back-reference store's manifest (empty until it exists);
    /// carried whole from checkpoint to checkpoint.
    pub backref_manifest: Vec<u8>,
}

/// What one checkpoint changed in the [`Meta`] of the previous one.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MetaDelta {
    pub next_id: u32,
    /// Versions added or changed, whole, in catalog order.
    pub versions: Vec<Version>,
    /// Versions removed.
    pub removed: Vec<VersionId>,
    /// New live bytes of segments whose figure changed (0: the entry is gone).
    pub usage: Vec<(crate::format::SegmentId, u64)>,
    /// New counts of blocks whose count changed (1 or less: the entry is gone).
    pub refcounts: Vec<(Addr, u32)>,
    /// The whole drop queue, when it changed.
    pub drop_queue: Option<Vec<BlockRef>>,
    /// The whole pending-deletion list, when it changed.
    pub pending_deletes: Option<Vec<PendingSegment>>,
    /// The whole back-reference manifest, when it changed.
    pub backref_manifest: Option<Vec<u8>>,
}

impl Meta {
    /// Folds in a delta (from disk: inconsistent deltas are corruption, not panics).
    pub(crate) fn apply(&mut self, d: MetaDelta) -> Result<()> {
        self.catalog.next_id = d.next_id;
        for id in d.removed {
            let before = self.catalog.versions.len();
            self.catalog.versions.retain(|v| v.id != id);
            if self.catalog.versions.len() == before {
                return Err(Error::corrupted(
                    "metadata",
                    format!("delta removes unknown version {}", id.0),
                ));
            }
        }
        for v in d.versions {
            match self.catalog.by_id_mut(v.id) {
                Some(slot) => *slot = v,
                None => self.catalog.versions.push(v),
            }
        }
        for (seg, live) in d.usage {
            if live == 0 {
                self.usage.remove(&seg);
            } else {
                self.usage.insert(seg, live);
            }
        }
        for (addr, count) in d.refcounts {
            if count <= 1 {
                self.refcounts.remove(&addr);
            } else {
                self.refcounts.insert(addr, count);
            }
        }
        if let Some(q) = d.drop_queue {
            self.drop_queue = q;
        }
        if let Some(p) = d.pending_deletes {
            self.pending_deletes = p;
        }
        if let Some(m) = d.backref_manifest {
            self.backref_manifest = m;
        }
        Ok(())
    }

    /// The catalog part of a delta from this metadata to `new`: entries added or
    /// changed (roots by address, so the result pins no tree in memory) and ids
    /// removed. O(versions) in memory; the result is O(change).
    pub(crate) fn catalog_changes(&self, new: &Catalog) -> (Vec<Version>, Vec<VersionId>) {
        let old: BTreeMap<VersionId, &Version> =
            self.catalog.versions.iter().map(|v| (v.id, v)).collect();
        let changed = new
            .versions
            .iter()
            .filter(|v| old.get(&v.id).is_none_or(|o| !same_entry(o, v)))
            .map(|v| Version {
                root: v.root.as_ref().map(crate::btree::node::Child::unpinned),
                ..v.clone()
            })
            .collect();
        let kept: std::collections::BTreeSet<VersionId> =
            new.versions.iter().map(|v| v.id).collect();
        let removed = self
            .catalog
            .versions
            .iter()
            .map(|v| v.id)
            .filter(|id| !kept.contains(id))
            .collect();
        (changed, removed)
    }
}

pub(crate) use codec::{encode_base, encode_delta, link_delta};

#[cfg(test)]
mod tests;
