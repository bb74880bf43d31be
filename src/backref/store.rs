//! The back-reference store: the runs, the deletion vector, persistence at
//! checkpoints, compaction, and the queries.
//!
//! Runs are stored as blobs appended to the data segments, like the metadata chain's
//! blobs, so that a checkpoint makes them durable with the one segment sync it does
//! anyway (no fsync of a file and of the directory of their own). A run larger than
//! [`RUN_BLOB_MAX_BYTES`] is split into several blobs, so that no blob outgrows a
//! segment. Run blobs are not live bytes: like chain blobs, they are dead space in
//! the segment accounting, kept by protection rather than by usage.
//!
//! Crash-consistency protocol (the engine's side of invariants 4 and 5 in `mod.rs`):
//!
//! 1. at checkpoint `gen`, the engine freezes its write store (`std::mem::take`),
//!    records the edges of every node the checkpoint writes (`add_written`), and calls
//!    `persist(segments, frozen, gen, compact)`; it appends every new run's blobs and
//!    returns the manifest bytes that name them;
//! 2. the engine embeds those bytes in its metadata, syncs the segments (which makes
//!    the run blobs durable too) and writes its superblock;
//! 3. the engine never deletes a segment holding a blob of a run either superblock
//!    slot's manifest names ([`run_segments`]); when a segment it wants to delete
//!    holds blobs of the current runs, it asks `persist` to compact, which rewrites
//!    every run as one new run appended elsewhere (as the metadata chain is rebased).
//!    Blobs no manifest names any more are dead bytes the cleaner reclaims.
//!
//! An error from `persist` or `compact` leaves this object unchanged (blobs it may
//! have appended are dead bytes no manifest names), but the engine should treat it as
//! it treats any checkpoint I/O error.

use super::manifest::{Manifest, RunEntry};
use super::record::{merge_join, Kind, Record};
use super::run::Run;
use super::{Edge, WriteStore};
use crate::error::{Error, Result};
use crate::format::{Addr, AddrSet, BlockRef, SegmentId};
use crate::space::{Segments, SEGMENT_TARGET_BYTES};
use std::collections::BTreeSet;
use std::ops::{Range, RangeInclusive};
use std::time::{Duration, Instant};

/// More runs than this after a checkpoint trigger a compaction into one.
pub(crate) const MAX_RUNS: usize = 8;

/// A run's bytes are appended in blobs of at most this size. A blob larger than a
/// segment's target size would get a segment of its own and make it oversized (and
/// a blob's length is a `u32`), so a large run is split: a quarter of the target
/// keeps the segments near their size and still makes few, long appends.
pub(crate) const RUN_BLOB_MAX_BYTES: usize = (SEGMENT_TARGET_BYTES / 4) as usize;

/// The segments holding a blob of a run the manifest `bytes` names.
pub(crate) fn run_segments(bytes: &[u8]) -> Result<Vec<SegmentId>> {
    let manifest = Manifest::decode(bytes)?;
    Ok(segments_of(manifest.runs.iter().flat_map(|r| &r.blobs)))
}

/// The sorted, distinct segments of `blobs`.
fn segments_of<'b>(blobs: impl Iterator<Item = &'b BlockRef>) -> Vec<SegmentId> {
    let mut s: Vec<SegmentId> = blobs.map(|b| b.addr.segment()).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// The back references of a store: its runs (decoded, oldest first) and deletion
/// vector. The current write store is not here: the engine owns it and passes it to
/// each query.
pub(crate) struct BackrefStore {
    runs: Vec<Run>,
    /// The blobs holding each run's bytes: `blobs[i]` are `runs[i]`'s, in order.
    blobs: Vec<Vec<BlockRef>>,
    deleted: BTreeSet<SegmentId>,
    /// Segments a compaction dropped from the deletion vector since open. No run
    /// names them any more, but a write store frozen later might still hold a record
    /// added before the deletion, so they keep filtering (memory only: after a reopen
    /// the write store holds only what came after the manifest).
    retired: BTreeSet<SegmentId>,
    next_seq: u64,
    /// Largest blob a run is appended as ([`RUN_BLOB_MAX_BYTES`]; tests lower it).
    blob_max: usize,
    /// Time spent on back references since open: recording them (the write stores
    /// persisted so far), writing runs and compacting.
    time_spent: Duration,
    /// What `persist` and `compact` wrote since open.
    written: Written,
}

/// Totals of the runs a store wrote since open (level-0 runs and compactions).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Written {
    pub bytes: u64,
    pub records: u64,
    pub compactions: u64,
}

impl BackrefStore {
    /// Loads the store `manifest` describes (an empty store for `None`), reading every
    /// run it names from `segments` and checking it (a missing segment or a blob that
    /// fails its checksum is corruption).
    pub(crate) fn open(segments: &Segments, manifest: Option<&[u8]>) -> Result<BackrefStore> {
        let manifest = match manifest {
            Some(bytes) => Manifest::decode(bytes)?,
            None => Manifest::default(),
        };
        let runs = manifest
            .runs
            .iter()
            .map(|entry| load_run(segments, entry))
            .collect::<Result<Vec<Run>>>()?;
        Ok(BackrefStore {
            runs,
            blobs: manifest.runs.into_iter().map(|r| r.blobs).collect(),
            deleted: manifest.deleted.into_iter().collect(),
            retired: BTreeSet::new(),
            next_seq: manifest.next_seq,
            blob_max: RUN_BLOB_MAX_BYTES,
            time_spent: Duration::ZERO,
            written: Written::default(),
        })
    }

    /// Splits runs into blobs of at most `bytes` from now on.
    #[cfg(test)]
    pub(crate) fn set_blob_max(&mut self, bytes: usize) {
        self.blob_max = bytes;
    }

    /// The manifest describing the current state.
    pub(crate) fn manifest(&self) -> Vec<u8> {
        Manifest {
            next_seq: self.next_seq,
            runs: self
                .runs
                .iter()
                .zip(&self.blobs)
                .map(|(run, blobs)| RunEntry {
                    meta: run.meta,
                    blobs: blobs.clone(),
                })
                .collect(),
            deleted: self.deleted.iter().copied().collect(),
        }
        .encode()
    }

    /// Appends `frozen` as the level-0 run of checkpoint `gen` (none if it is
    /// empty), compacts if that makes more than [`MAX_RUNS`] runs or `compact` asks
    /// for it (see [`BackrefStore::compact`]), and returns the new manifest. The new
    /// blobs are durable with the next [`Segments::sync`], which the caller must do
    /// before anything durable names the manifest. On an error the store is as it
    /// was (the blobs appended before it are bytes nothing names).
    pub(crate) fn persist(
        &mut self,
        segments: &Segments,
        frozen: &WriteStore,
        gen: u64,
        compact: bool,
    ) -> Result<Vec<u8>> {
        let started = Instant::now();
        let result = self.checkpoint(segments, frozen, gen, compact);
        self.time_spent += started.elapsed();
        if result.is_ok() {
            // A failed persist's store is handed to the next checkpoint, which counts
            // the time spent recording its edges then.
            self.time_spent += frozen.time_spent;
        }
        result
    }

    /// Merges every run into one combined run now (cancelling `From`/`To` pairs and
    /// purging records the deletion vector kills), appended as new blobs, and returns
    /// the new manifest. The blobs of the runs it replaces become dead bytes (kept as
    /// long as a superblock slot's manifest names them). A single run is rewritten
    /// too: the engine compacts to move the runs out of a segment it wants to delete.
    /// (The engine asks for it through `persist`, in the same step as the level-0 run.)
    #[cfg(test)]
    pub(crate) fn compact(&mut self, segments: &Segments, gen: u64) -> Result<Vec<u8>> {
        let started = Instant::now();
        let result = self.checkpoint(segments, &WriteStore::default(), gen, true);
        self.time_spent += started.elapsed();
        result
    }

    /// Time spent on back references since open: recording the edges of the write
    /// stores persisted so far, building their runs and appending them, compacting.
    pub(crate) fn time_spent(&self) -> Duration {
        self.time_spent
    }

    /// What this store wrote since open.
    pub(crate) fn written(&self) -> Written {
        self.written
    }

    fn checkpoint(
        &mut self,
        segments: &Segments,
        frozen: &WriteStore,
        gen: u64,
        force: bool,
    ) -> Result<Vec<u8>> {
        let mut next_seq = self.next_seq;
        // Sized up front: a checkpoint after a GiB of volume writes holds a quarter
        // of a million records, and growing by doubling copied them and faulted in
        // fresh pages at each step (a tenth of a busy server's CPU).
        let mut records = Vec::with_capacity(frozen.records_bound());
        // Records come in (child, parent) order, so runs of them name the same
        // segments: one set lookup per segment change, not four per record (they
        // were most of a checkpoint's CPU under a stream of volume writes).
        let mut child = SegmentMemo::default();
        let mut parent = SegmentMemo::default();
        records.extend(frozen.records(gen).filter(|r| {
            !child.get(r.child.segment(), |seg| self.is_dead_segment(seg))
                && !parent.get(r.parent.segment(), |seg| self.is_dead_segment(seg))
        }));
        let mut level0 = None;
        if !records.is_empty() {
            level0 = Some(Run::build(next_seq, gen, false, records));
            next_seq += 1;
        }
        let run_count = self.runs.len() + usize::from(level0.is_some());
        // A forced compaction rewrites even a single run: the engine forces one to
        // move the runs out of a segment it wants to delete.
        let compact =
            run_count > MAX_RUNS || (force && (run_count > 0 || !self.deleted.is_empty()));
        let mut new_runs = Vec::new();
        if compact {
            let merged = self.merge(level0.as_ref().map(|(run, _)| run));
            if !merged.is_empty() {
                let (run, bytes) = Run::build(next_seq, gen, true, merged);
                next_seq += 1;
                new_runs.push((run, self.append_run(segments, &bytes)?));
            }
            // The level-0 run is in the combined one: its bytes are never written.
        } else if let Some((run, bytes)) = level0 {
            let blobs = self.append_run(segments, &bytes)?;
            new_runs.push((run, blobs));
        }
        // Every blob is appended: commit the new state.
        for (run, _) in &new_runs {
            self.written.bytes += run.meta.file_len;
            self.written.records += run.meta.record_count;
        }
        self.written.compactions += u64::from(compact);
        self.next_seq = next_seq;
        if compact {
            self.runs.clear();
            self.blobs.clear();
            // No record in any run names a deleted segment any more (compaction purged
            // them, and `persist` filters new records), so the entries can go.
            self.retired.append(&mut self.deleted);
        }
        for (run, blobs) in new_runs {
            self.runs.push(run);
            self.blobs.push(blobs);
        }
        Ok(self.manifest())
    }

    /// Appends a run's encoded `bytes` as blobs of at most `blob_max` bytes.
    fn append_run(&self, segments: &Segments, bytes: &[u8]) -> Result<Vec<BlockRef>> {
        bytes
            .chunks(self.blob_max)
            .map(|chunk| segments.append(chunk))
            .collect()
    }

    /// The segments holding a blob of one of the current runs (sorted, distinct).
    pub(crate) fn segments(&self) -> Vec<SegmentId> {
        segments_of(self.blobs.iter().flatten())
    }

    /// The live `From` records of every run and of `level0`, in key order: the edges
    /// of gone parents are dropped, and so are the `Gone` records themselves (every
    /// run is merged, so no record they end is left anywhere).
    fn merge(&self, level0: Option<&Run>) -> Vec<Record> {
        let sources: Vec<&[Record]> = self.runs.iter().chain(level0).map(Run::records).collect();
        let mut live = Vec::with_capacity(sources.iter().map(|s| s.len()).max().unwrap_or(0));
        // Every record asks whether its parent is gone: one hash probe each, not a
        // search of every run's `Gone` records (a merge of a large store's runs met
        // hundreds of thousands of records, and a search per run cost each several
        // cache misses: half a second per compaction at 10M keys).
        let gone: AddrSet<Addr> = self
            .runs
            .iter()
            .chain(level0)
            .flat_map(Run::gone_parents)
            .collect();
        merge_join(sources, |r| {
            if !self.is_dead(r) && !gone.contains(&r.parent) {
                live.push(*r);
            }
        });
        live
    }

    /// Whether the node `parent` was freed, by a run or by the write store.
    fn is_gone(&self, parent: Addr, ws: &WriteStore) -> bool {
        ws.gone(parent) || self.runs.iter().any(|run| run.gone(parent))
    }

    /// Marks `segment` deleted: every record naming an address in it is dead from now
    /// on. Durable with the next manifest.
    pub(crate) fn delete_segment(&mut self, segment: SegmentId) {
        self.deleted.insert(segment);
    }

    /// Takes `segment` out of the deletion vector: records naming it count again.
    /// Only for a segment named there in error (its file still holds live blocks).
    pub(crate) fn undelete_segment(&mut self, segment: SegmentId) {
        self.deleted.remove(&segment);
    }

    /// The deletion vector, in order.
    pub(crate) fn deleted_segments(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.deleted.iter().copied()
    }

    /// Whether the deletion vector (or a segment retired from it) kills `r`.
    fn is_dead(&self, r: &Record) -> bool {
        self.is_dead_segment(r.child.segment()) || self.is_dead_segment(r.parent.segment())
    }

    /// Whether the deletion vector (or a segment retired from it) names `seg`.
    fn is_dead_segment(&self, seg: SegmentId) -> bool {
        let names = |set: &BTreeSet<SegmentId>| !set.is_empty() && set.contains(&seg);
        names(&self.deleted) || names(&self.retired)
    }

    /// The live edges whose child is in `children`, in `(child, parent)` order.
    pub(crate) fn edges(&self, children: Range<Addr>, ws: &WriteStore) -> Vec<Edge> {
        let mut out = Vec::new();
        self.edges_into(children, ws, &mut out);
        out
    }

    /// As [`BackrefStore::edges`], appending to `out`.
    pub(crate) fn edges_into(&self, children: Range<Addr>, ws: &WriteStore, out: &mut Vec<Edge>) {
        if let Some(last) = children.end.0.checked_sub(1) {
            if children.start.0 <= last {
                self.collect(&(children.start.0..=last), None, ws, out);
            }
        }
    }

    /// The parents of the live edges to `child`, in order.
    pub(crate) fn parents(&self, child: Addr, ws: &WriteStore) -> Vec<Addr> {
        let mut out = Vec::new();
        self.collect(&(child.0..=child.0), Some(child), ws, &mut out);
        out.into_iter().map(|e| e.parent).collect()
    }

    /// Every live edge, in `(child, parent)` order.
    pub(crate) fn live_edges(&self, ws: &WriteStore) -> Vec<Edge> {
        let mut out = Vec::new();
        self.collect(&(0..=u64::MAX), None, ws, &mut out);
        out
    }

    /// Appends the live edges with a child in `children` (or exactly `point`, which
    /// lets the Bloom filters skip runs) to `out`.
    fn collect(
        &self,
        children: &RangeInclusive<u64>,
        point: Option<Addr>,
        ws: &WriteStore,
        out: &mut Vec<Edge>,
    ) {
        let slice = |run| run_slice(run, children, point);
        let mut sources = usize::from(ws.any_in(children));
        let mut only: &[Record] = &[];
        for run in &self.runs {
            let s = slice(run);
            if !s.is_empty() {
                sources += 1;
                only = s;
            }
        }
        match sources {
            0 => {}
            // One run alone: its keys are unique, so its `From`s are the live edges.
            1 if !only.is_empty() => out.extend(
                only.iter()
                    .filter(|r| {
                        r.kind == Kind::From && !self.is_dead(r) && !self.is_gone(r.parent, ws)
                    })
                    .map(Record::edge),
            ),
            _ => {
                let pending: Vec<Record> = ws.range(children).collect();
                let sources = self
                    .runs
                    .iter()
                    .map(slice)
                    .chain(std::iter::once(pending.as_slice()))
                    .collect();
                merge_join(sources, |r| {
                    if !self.is_dead(r) && !self.is_gone(r.parent, ws) {
                        out.push(r.edge());
                    }
                });
            }
        }
    }

    /// Records in all runs.
    pub(crate) fn record_count(&self) -> u64 {
        self.runs.iter().map(|r| r.meta.record_count).sum()
    }

    pub(crate) fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Bytes of all current runs (their blobs' total length).
    pub(crate) fn bytes_on_disk(&self) -> u64 {
        self.runs.iter().map(|r| r.meta.file_len).sum()
    }

    #[cfg(test)]
    pub(crate) fn runs(&self) -> &[Run] {
        &self.runs
    }
}

/// The records of `run` a query for `children` (or exactly `point`) must look at.
fn run_slice<'r>(
    run: &'r Run,
    children: &RangeInclusive<u64>,
    point: Option<Addr>,
) -> &'r [Record] {
    match point {
        Some(child) => run.point(child),
        None => run.range(children),
    }
}

/// Reads the blobs of the run `entry` names from the segments and decodes the run.
fn load_run(segments: &Segments, entry: &RunEntry) -> Result<Run> {
    let len = usize::try_from(entry.meta.file_len)
        .map_err(|_| Error::corrupted("backref run", "too large"))?;
    let mut bytes = Vec::with_capacity(len);
    for blob in &entry.blobs {
        // Checks the blob's checksum; a missing segment is corruption too.
        bytes.extend_from_slice(&segments.read(*blob, "backref run")?);
    }
    Run::decode(&bytes, &entry.meta)
}

/// The last answer of a question about a segment, for a stream of records that name
/// the same segment many times in a row.
#[derive(Default)]
struct SegmentMemo(Option<(SegmentId, bool)>);

impl SegmentMemo {
    fn get(&mut self, seg: SegmentId, ask: impl FnOnce(SegmentId) -> bool) -> bool {
        match self.0 {
            Some((last, answer)) if last == seg => answer,
            _ => {
                let answer = ask(seg);
                self.0 = Some((seg, answer));
                answer
            }
        }
    }
}
