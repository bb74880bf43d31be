//! Space: log-structured segments and what is live in them.
//!
//! Everything durable except the superblock and the WAL lives in append-only segment
//! files: tree nodes (written by checkpoints), value extents (written by commits) and
//! the metadata blob of each checkpoint (a delta or a base of the metadata chain). Nothing is ever overwritten in place.
//!
//! Invariants:
//! - A byte reachable from the durable superblock is never overwritten: appends go to
//!   the end of the active segment, and a segment is deleted only when its live bytes
//!   are zero in a durable checkpoint *and* no reader view can still reach it.
//! - Live bytes change only through [`SpaceDelta`]s: a transaction collects its own and
//!   merges it at commit (an aborted transaction's changes simply vanish); the writer
//!   accumulates the deltas of one checkpoint interval; the checkpoint adds them, plus
//!   the nodes it writes, to the durable usage table.
//! - Segment ids are never reused.

mod segments;

pub(crate) use segments::{
    checksum_refs, AppendFence, Pin, Segments, UnsyncedValues, ValuesPlan, ValuesSync,
    SEGMENT_HEADER_SIZE, SEGMENT_TARGET_BYTES,
};

use crate::format::{BlockRef, SegmentId};
use std::collections::BTreeMap;

/// Changes to live bytes per segment.
#[derive(Default, Debug, Clone)]
pub(crate) struct SpaceDelta {
    pub per_segment: BTreeMap<SegmentId, i64>,
}

impl SpaceDelta {
    pub(crate) fn alloc(&mut self, r: BlockRef) {
        *self.per_segment.entry(r.addr.segment()).or_default() += i64::from(r.len);
    }

    pub(crate) fn free(&mut self, r: BlockRef) {
        *self.per_segment.entry(r.addr.segment()).or_default() -= i64::from(r.len);
    }

    pub(crate) fn merge(&mut self, other: SpaceDelta) {
        for (seg, d) in other.per_segment {
            *self.per_segment.entry(seg).or_default() += d;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.per_segment.values().all(|&d| d == 0)
    }
}

/// Live bytes per segment as of a checkpoint.
pub(crate) type Usage = BTreeMap<SegmentId, u64>;
