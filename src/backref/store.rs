//! The back-reference store: the runs, the deletion vector, persistence at
//! checkpoints, compaction, garbage collection of run files, and the queries.
//!
//! Crash-consistency protocol (the engine's side of invariants 4 and 5 in `mod.rs`):
//!
//! 1. at checkpoint `gen`, the engine freezes its write store (`std::mem::take`),
//!    records the edges of every node the checkpoint writes (`add_written`), and calls
//!    `persist(frozen, gen)`; it returns the manifest bytes once every new run file
//!    and the directory are durable;
//! 2. the engine embeds those bytes in its metadata and writes its superblock;
//! 3. once the superblock is durable, it calls `collect_garbage(&[current, fallback])`
//!    with the manifests of both superblock slots: run files named by neither (nor by
//!    this store) are removed. At open, a writable engine calls it the same way, which
//!    removes the files of checkpoints that never became durable.
//!
//! An error from `persist` or `compact` leaves this object unchanged (a run file it
//! may have written is garbage for `collect_garbage`), but the engine should treat it
//! as it treats any checkpoint I/O error.

use super::manifest::{Manifest, RunMeta};
use super::record::{merge_join, Kind, Record};
use super::run::{self, Run};
use super::{Edge, WriteStore};
use crate::error::{Error, Result};
use crate::format::{Addr, SegmentId};
use crate::io::Vfs;
use std::collections::BTreeSet;
use std::io;
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// More runs than this after a checkpoint trigger a compaction into one.
pub(crate) const MAX_RUNS: usize = 8;

/// The back references of a store: its runs (decoded, oldest first) and deletion
/// vector. The current write store is not here: the engine owns it and passes it to
/// each query.
pub(crate) struct BackrefStore {
    vfs: Arc<dyn Vfs>,
    runs: Vec<Run>,
    deleted: BTreeSet<SegmentId>,
    /// Segments a compaction dropped from the deletion vector since open. No run
    /// names them any more, but a write store frozen later might still hold a record
    /// added before the deletion, so they keep filtering (memory only: after a reopen
    /// the write store holds only what came after the manifest).
    retired: BTreeSet<SegmentId>,
    next_seq: u64,
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
    /// Loads the store `manifest` describes (an empty store for `None`), reading and
    /// checking every run it names. Removes nothing (see `collect_garbage`).
    pub(crate) fn open(vfs: Arc<dyn Vfs>, manifest: Option<&[u8]>) -> Result<BackrefStore> {
        let manifest = match manifest {
            Some(bytes) => Manifest::decode(bytes)?,
            None => Manifest::default(),
        };
        let runs = manifest
            .runs
            .iter()
            .map(|meta| load_run(&*vfs, meta))
            .collect::<Result<Vec<Run>>>()?;
        Ok(BackrefStore {
            vfs,
            runs,
            deleted: manifest.deleted.into_iter().collect(),
            retired: BTreeSet::new(),
            next_seq: manifest.next_seq,
            time_spent: Duration::ZERO,
            written: Written::default(),
        })
    }

    /// The manifest describing the current state.
    pub(crate) fn manifest(&self) -> Vec<u8> {
        Manifest {
            next_seq: self.next_seq,
            runs: self.runs.iter().map(|r| r.meta).collect(),
            deleted: self.deleted.iter().copied().collect(),
        }
        .encode()
    }

    /// Writes `frozen` as the level-0 run of checkpoint `gen` (none if it is empty),
    /// compacts if that makes more than [`MAX_RUNS`] runs, makes the files and the
    /// directory durable, and returns the new manifest.
    pub(crate) fn persist(&mut self, frozen: WriteStore, gen: u64) -> Result<Vec<u8>> {
        let started = Instant::now();
        let result = self.checkpoint(&frozen, gen, false);
        self.time_spent += frozen.time_spent + started.elapsed();
        result
    }

    /// Merges every run into one combined run now (cancelling `From`/`To` pairs and
    /// purging records the deletion vector kills) and returns the new manifest. The
    /// runs it replaces stay on disk until `collect_garbage` no longer has to keep them.
    pub(crate) fn compact(&mut self, gen: u64) -> Result<Vec<u8>> {
        let started = Instant::now();
        let result = self.checkpoint(&WriteStore::default(), gen, true);
        self.time_spent += started.elapsed();
        result
    }

    /// Time spent on back references since open: recording the edges of the write
    /// stores persisted so far, writing their runs (fsyncs included) and compacting.
    pub(crate) fn time_spent(&self) -> Duration {
        self.time_spent
    }

    /// What this store wrote since open.
    pub(crate) fn written(&self) -> Written {
        self.written
    }

    fn checkpoint(&mut self, frozen: &WriteStore, gen: u64, force: bool) -> Result<Vec<u8>> {
        let mut next_seq = self.next_seq;
        let records: Vec<Record> = frozen.records(gen).filter(|r| !self.is_dead(r)).collect();
        let mut level0 = None;
        if !records.is_empty() {
            level0 = Some(self.write_run(next_seq, gen, false, records)?);
            next_seq += 1;
        }
        let run_count = self.runs.len() + usize::from(level0.is_some());
        let compact =
            run_count > MAX_RUNS || (force && (run_count > 1 || !self.deleted.is_empty()));
        let mut combined = None;
        if compact {
            let merged = self.merge(level0.as_ref());
            if !merged.is_empty() {
                combined = Some(self.write_run(next_seq, gen, true, merged)?);
                next_seq += 1;
            }
        }
        if level0.is_some() || combined.is_some() {
            // New run files: their names must be durable before a manifest names them.
            self.vfs.sync_dir()?;
        }
        // Everything is durable: commit the new state.
        for run in level0.iter().chain(&combined) {
            self.written.bytes += run.meta.file_len;
            self.written.records += run.meta.record_count;
        }
        self.written.compactions += u64::from(compact);
        self.next_seq = next_seq;
        if compact {
            self.runs = combined.into_iter().collect();
            // No record in any run names a deleted segment any more (compaction purged
            // them, and `persist` filters new records), so the entries can go.
            self.retired.append(&mut self.deleted);
        } else {
            self.runs.extend(level0);
        }
        Ok(self.manifest())
    }

    /// Writes and fsyncs run `seq`.
    fn write_run(&self, seq: u64, gen: u64, combined: bool, records: Vec<Record>) -> Result<Run> {
        let (run, bytes) = Run::build(seq, gen, combined, records);
        let name = run::file_name(seq);
        // A file of this number can only be garbage of a checkpoint that never became
        // durable: every manifest that can still be read has `next_seq <= seq`.
        if self.vfs.exists(&name)? {
            self.vfs.remove(&name)?;
        }
        let file = self.vfs.create(&name)?;
        file.write_all_at(&bytes, 0)?;
        file.sync()?;
        Ok(run)
    }

    /// The live `From` records of every run and of `level0`, in key order: the edges
    /// of gone parents are dropped, and so are the `Gone` records themselves (every
    /// run is merged, so no record they end is left anywhere).
    fn merge(&self, level0: Option<&Run>) -> Vec<Record> {
        let sources: Vec<&[Record]> = self.runs.iter().chain(level0).map(Run::records).collect();
        let mut live = Vec::with_capacity(sources.iter().map(|s| s.len()).max().unwrap_or(0));
        let gone = |parent| self.runs.iter().chain(level0).any(|run| run.gone(parent));
        merge_join(sources, |r| {
            if !self.is_dead(r) && !gone(r.parent) {
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

    /// The deletion vector, in order.
    #[cfg(test)]
    pub(crate) fn deleted_segments(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.deleted.iter().copied()
    }

    /// Whether the deletion vector (or a segment retired from it) kills `r`.
    fn is_dead(&self, r: &Record) -> bool {
        let names = |set: &BTreeSet<SegmentId>| {
            !set.is_empty()
                && (set.contains(&r.child.segment()) || set.contains(&r.parent.segment()))
        };
        names(&self.deleted) || names(&self.retired)
    }

    /// Removes every run file named neither by this store nor by any manifest in
    /// `keep` (pass both superblock slots' manifests). Returns how many it removed.
    pub(crate) fn collect_garbage(&mut self, keep: &[&[u8]]) -> Result<usize> {
        let mut live: BTreeSet<u64> = self.runs.iter().map(|r| r.meta.seq).collect();
        for bytes in keep {
            let m = Manifest::decode(bytes)?;
            live.extend(m.runs.iter().map(|r| r.seq));
            // Never hand out a number a kept manifest may name.
            self.next_seq = self.next_seq.max(m.next_seq);
        }
        let mut removed = 0;
        for name in self.vfs.list()? {
            if run::parse_file_name(&name).is_some_and(|seq| !live.contains(&seq)) {
                self.vfs.remove(&name)?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.vfs.sync_dir()?;
        }
        Ok(removed)
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

    /// Bytes of all run files.
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

/// Reads and checks the run `meta` describes.
fn load_run(vfs: &dyn Vfs, meta: &RunMeta) -> Result<Run> {
    let name = run::file_name(meta.seq);
    let missing = |e: io::Error| match e.kind() {
        // (A dangling link is there but not a file: `Error::from` says so.)
        io::ErrorKind::NotFound if crate::error::not_a_file_description(&e).is_none() => {
            Error::corrupted("backref run", format!("{name} is missing"))
        }
        _ => Error::from(e),
    };
    let file = vfs.open(&name).map_err(missing)?;
    let len = file.len()?;
    if len != meta.file_len {
        return Err(Error::corrupted(
            "backref run",
            format!("{name} is {len} bytes, manifest says {}", meta.file_len),
        ));
    }
    let mut bytes =
        vec![0; usize::try_from(len).map_err(|_| Error::corrupted("backref run", "too large"))?];
    file.read_exact_at(&mut bytes, 0)?;
    Run::decode(&bytes, meta)
}
