//! Tests of the back-reference store: pruning, the Bloom filter, the codecs against
//! corruption, crash safety of `persist`, and a random-operation run (checkpoints,
//! compactions, segment deletions, reopens and crashes) checked against a model.

use super::bloom::Bloom;
use super::manifest::Manifest;
use super::run;
use super::{run_segments, BackrefStore, Edge, WriteStore, MAX_RUNS};
use crate::error::Result;
use crate::format::{Addr, BlockRef, SegmentId};
use crate::io::sim::{SimVfs, SplitMix};
use crate::io::Vfs;
use crate::space::Segments;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn addr(seg: u32, off: u64) -> Addr {
    Addr::new(SegmentId(seg), off)
}

fn block(a: Addr, len: u32) -> BlockRef {
    BlockRef {
        addr: a,
        len,
        crc: 0,
    }
}

/// Opens the store `manifest` describes, reading its runs through segments opened
/// afresh (read-only), as an open after a restart would.
fn open(vfs: &SimVfs, manifest: Option<&[u8]>) -> Result<BackrefStore> {
    BackrefStore::open(&Segments::open(Arc::new(vfs.clone()), true)?, manifest)
}

/// Writable segments on `vfs`, for `persist` to append to.
fn segments(vfs: &SimVfs) -> Segments {
    Segments::open(Arc::new(vfs.clone()), false).unwrap()
}

/// `persist`, then the segment sync the engine does before its superblock.
fn persist(store: &mut BackrefStore, segs: &Segments, ws: WriteStore, gen: u64) -> Vec<u8> {
    let m = store.persist(segs, &ws, gen, false).unwrap();
    segs.sync().unwrap();
    m
}

/// The blobs of every run `manifest` names, oldest run first.
fn blobs(manifest: &[u8]) -> Vec<BlockRef> {
    Manifest::decode(manifest)
        .unwrap()
        .runs
        .into_iter()
        .flat_map(|r| r.blobs)
        .collect()
}

fn run_files(vfs: &SimVfs) -> Vec<String> {
    let mut names: Vec<String> = vfs
        .names()
        .into_iter()
        .filter(|n| run::parse_file_name(n).is_some())
        .collect();
    names.sort();
    names
}

#[test]
fn add_then_remove_in_one_write_store_leaves_nothing() {
    let (c, p) = (addr(1, 0), addr(2, 0));
    let mut ws = WriteStore::new();
    ws.add(block(c, 10), p);
    ws.remove(c, p);
    assert!(ws.is_empty());

    // Across a transaction's delta, merged at commit.
    let mut ws = WriteStore::new();
    ws.add(block(c, 10), p);
    ws.add(block(addr(1, 5), 10), p);
    let mut delta = WriteStore::new();
    delta.remove(c, p);
    delta.remove(addr(3, 3), p);
    ws.merge(delta);
    let left: Vec<_> = ws.records(1).map(|r| r.key()).collect();
    assert_eq!(left, vec![(addr(1, 5), p), (addr(3, 3), p)]);

    // Persisting an all-cancelled write store writes no run.
    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    let mut ws = WriteStore::new();
    ws.add(block(c, 10), p);
    ws.remove(c, p);
    let m = persist(&mut store, &segs, ws, 1);
    assert_eq!(store.run_count(), 0);
    assert!(run_files(&vfs).is_empty());
    assert!(blobs(&m).is_empty());
    assert!(open(&vfs, Some(&m))
        .unwrap()
        .live_edges(&WriteStore::new())
        .is_empty());
}

#[test]
fn documented_layouts_are_the_code_s() {
    crate::format_tests::check_layout(
        "backref-run-header",
        &[
            ("magic", 0),
            ("version", 8),
            ("flags", 12),
            ("seq", 16),
            ("gen", 24),
            ("record_count", 32),
        ],
        run::HEADER_SIZE,
    );
    // The encoder agrees: a run of three records is the header, the records (each
    // coded against the one before) and the crc.
    let vfs = SimVfs::new();
    let (store, _) = small_store(&vfs);
    let r = &store.runs()[0];
    // Each record is a tag, the child's and the parent's differences from the
    // record before, and a From's length: From 1:0 -> 2:0 (100 bytes), From
    // 1:100 -> 2:0 (50 bytes), To 1:200 -> 2:8.
    let records = [
        1 + varint_len(addr(1, 0).0) + varint_len(zigzag(addr(2, 0).0)) + varint_len(100),
        1 + varint_len(100) + varint_len(zigzag(0)) + varint_len(50),
        1 + varint_len(100) + varint_len(zigzag(8)),
    ];
    let want = run::HEADER_SIZE + records.iter().sum::<usize>() + 4;
    assert_eq!(r.meta.file_len, want as u64);
}

fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros() as usize).max(1).div_ceil(7)
}

fn zigzag(v: u64) -> u64 {
    let s = v as i64;
    ((s << 1) ^ (s >> 63)) as u64
}

#[test]
fn run_range_matches_a_scan() {
    use super::record::{Kind, Record};
    use super::run::Run;
    let mut rng = SplitMix(3);
    for round in 0..40 {
        // Runs long enough for the index, with children repeated across its blocks.
        let mut keys = BTreeSet::new();
        for _ in 0..rng.below(3000) + 1 {
            keys.insert((rng.below(500) * 8, rng.below(200)));
        }
        let records: Vec<Record> = keys
            .iter()
            .map(|&(c, p)| Record {
                child: Addr(c),
                parent: Addr(p),
                gen: 1,
                len: 1,
                kind: Kind::From,
            })
            .collect();
        let (run, _) = Run::build(1, 1, false, records.clone());
        for _ in 0..200 {
            let lo = rng.below(4200);
            let hi = lo + rng.below(64);
            let want: Vec<Record> = records
                .iter()
                .filter(|r| (lo..=hi).contains(&r.child.0))
                .copied()
                .collect();
            assert_eq!(
                run.range(&(lo..=hi)),
                &want[..],
                "round {round}: {lo}..={hi}"
            );
            let want: Vec<Record> = records
                .iter()
                .filter(|r| r.child.0 == lo)
                .copied()
                .collect();
            assert_eq!(run.point(Addr(lo)), &want[..], "round {round}: {lo}");
        }
    }
}

#[test]
fn file_names_round_trip() {
    assert_eq!(run::parse_file_name(&run::file_name(0x2a)), Some(0x2a));
    assert_eq!(run::parse_file_name("backref-2a.run"), None);
    assert_eq!(run::parse_file_name("seg-00000001.dat"), None);
}

#[test]
fn bloom_has_no_false_negatives() {
    let mut rng = SplitMix(7);
    for round in 0..200 {
        let n = rng.below(2000) as usize;
        let keys: Vec<u64> = (0..n).map(|_| rng.next_u64() >> rng.below(64)).collect();
        let bloom = Bloom::build(keys.len(), keys.iter().copied());
        for &k in &keys {
            assert!(bloom.may_contain(k), "round {round}: lost key {k:#x}");
        }
    }
    // And it filters: about 1% false positives at 10 bits per key.
    let keys: Vec<u64> = (0..10_000u64).map(|i| addr(1, i * 4096).0).collect();
    let bloom = Bloom::build(keys.len(), keys.iter().copied());
    let fp = (0..100_000u64)
        .filter(|i| bloom.may_contain(addr(2, i * 4096).0))
        .count();
    assert!(fp < 2_000, "{fp} false positives in 100000");
}

/// A store with one persisted run (plus a fallback-free manifest).
fn small_store(vfs: &SimVfs) -> (BackrefStore, Vec<u8>) {
    let segs = segments(vfs);
    let mut store = open(vfs, None).unwrap();
    let mut ws = WriteStore::new();
    ws.add(block(addr(1, 0), 100), addr(2, 0));
    ws.add(block(addr(1, 100), 50), addr(2, 0));
    ws.remove(addr(1, 200), addr(2, 8));
    let m = persist(&mut store, &segs, ws, 3);
    (store, m)
}

#[test]
fn every_flipped_byte_of_a_run_is_a_checksum_error() {
    let vfs = SimVfs::new();
    let (_, m) = small_store(&vfs);
    let [blob] = blobs(&m)[..] else {
        panic!("one small run is one blob")
    };
    let name = blob.addr.segment().file_name();
    for off in blob.addr.offset()..blob.addr.offset() + u64::from(blob.len) {
        for xor in [0x01, 0x80] {
            assert!(vfs.corrupt(&name, off, xor));
            let err = open(&vfs, Some(&m)).err().expect("corruption detected");
            assert!(err.is_corruption(), "offset {off}: {err}");
            assert!(vfs.corrupt(&name, off, xor));
        }
    }
    assert_eq!(open(&vfs, Some(&m)).unwrap().record_count(), 3);

    // A truncated or missing segment too.
    let bytes = vfs.read_file(&name).unwrap();
    vfs.write_file(&name, &bytes[..bytes.len() - 1]);
    assert!(open(&vfs, Some(&m)).err().unwrap().is_corruption());
    vfs.remove(&name).unwrap();
    assert!(open(&vfs, Some(&m)).err().unwrap().is_corruption());
}

#[test]
fn runs_are_blobs_in_the_segments_split_when_large() {
    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    store.set_blob_max(16);
    let mut ws = WriteStore::new();
    for i in 0..50 {
        ws.add(block(addr(1, i * 64), 64), addr(2, i));
    }
    let m = persist(&mut store, &segs, ws, 1);
    assert!(run_files(&vfs).is_empty(), "no run file: {:?}", vfs.names());
    let b = blobs(&m);
    let total: u64 = b.iter().map(|b| u64::from(b.len)).sum();
    assert!(b.len() > 10 && b.iter().all(|b| b.len <= 16), "{b:?}");
    assert_eq!(total, store.bytes_on_disk());
    // In order, in the segment the appends went to.
    assert!(b.windows(2).all(|w| w[0].addr < w[1].addr));
    assert_eq!(run_segments(&m).unwrap(), vec![b[0].addr.segment()]);
    assert_eq!(store.segments(), run_segments(&m).unwrap());
    let reopened = open(&vfs, Some(&m)).unwrap();
    assert_eq!(reopened.live_edges(&WriteStore::new()).len(), 50);
    // One damaged blob among them fails the whole run.
    let mid = b[b.len() / 2];
    let name = mid.addr.segment().file_name();
    assert!(vfs.corrupt(&name, mid.addr.offset() + 3, 0x10));
    assert!(open(&vfs, Some(&m)).err().unwrap().is_corruption());
}

#[test]
fn damaged_manifests_are_errors() {
    let vfs = SimVfs::new();
    let (mut store, m) = small_store(&vfs);
    store.delete_segment(SegmentId(9));
    let m2 = store.manifest();
    assert_eq!(
        Manifest::decode(&m2).unwrap().deleted,
        vec![SegmentId(9)],
        "the deletion vector is in the manifest"
    );
    for bytes in [&m, &m2] {
        for len in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..len]).is_err(), "prefix {len}");
            assert!(open(&vfs, Some(&bytes[..len])).is_err(), "prefix {len}");
        }
        for off in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[off] ^= 0x04;
            assert!(Manifest::decode(&bad).is_err(), "flip at {off}");
        }
    }
    assert!(open(&vfs, Some(&m2)).is_ok());
}

/// Blob size for the crash test: the compacted run is several blobs, so that a crash
/// can cut the persist between them.
const SMALL_BLOBS: usize = 8;

/// Counts the mutating operations one `persist` of `ws` (and the segment sync after
/// it) performs on a fork.
fn persist_op_count(vfs: &SimVfs, manifest: &[u8], ws: &WriteStore) -> u64 {
    let fork = vfs.fork();
    let segs = segments(&fork);
    let mut store = open(&fork, Some(manifest)).unwrap();
    store.set_blob_max(SMALL_BLOBS);
    let before = fork.op_count();
    persist(&mut store, &segs, ws.clone(), 9);
    fork.op_count() - before
}

#[test]
fn a_crash_during_persist_leaves_the_previous_manifest_readable() {
    // Eight runs, so that the ninth persist also compacts.
    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    let mut manifest = Vec::new();
    let mut model = BTreeSet::new();
    for gen in 1..=MAX_RUNS as u64 {
        let mut ws = WriteStore::new();
        ws.add(block(addr(1, gen * 10), 10), addr(2, gen));
        model.insert((addr(1, gen * 10), addr(2, gen)));
        if gen > 2 {
            ws.remove(addr(1, (gen - 2) * 10), addr(2, gen - 2));
            model.remove(&(addr(1, (gen - 2) * 10), addr(2, gen - 2)));
        }
        manifest = persist(&mut store, &segs, ws, gen);
    }
    let mut ws = WriteStore::new();
    ws.add(block(addr(3, 0), 10), addr(2, 99));
    let ops = persist_op_count(&vfs, &manifest, &ws);
    assert!(ops >= 6, "the compacted run's blobs, the sync: {ops} ops");
    for fail_at in 0..=ops {
        for seed in 0..8 {
            let fork = vfs.fork();
            let segs = segments(&fork);
            let mut store = open(&fork, Some(&manifest)).unwrap();
            store.set_blob_max(SMALL_BLOBS);
            fork.set_fail_after(Some(fail_at));
            let result = store
                .persist(&segs, &ws, 9, false)
                .and_then(|m| segs.sync().map(|()| m));
            assert_eq!(result.is_ok(), fail_at >= ops, "fail at {fail_at}");
            let after = fork.crash(seed);
            // The superblock naming a new manifest was never written: the old one holds.
            let reopened = open(&after, Some(&manifest)).unwrap();
            let live: BTreeSet<_> = reopened
                .live_edges(&WriteStore::new())
                .iter()
                .map(|e| (e.child, e.parent))
                .collect();
            assert_eq!(live, model, "fail at {fail_at}, seed {seed}");
            // And a new manifest, once returned, is durable by itself.
            if let Ok(new) = result {
                let reopened = open(&after, Some(&new)).unwrap();
                assert_eq!(reopened.run_count(), 1);
                assert_eq!(
                    reopened.live_edges(&WriteStore::new()).len(),
                    model.len() + 1
                );
            }
        }
    }
}

#[test]
fn replaced_runs_stay_readable_in_their_segments() {
    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    let mut manifests = Vec::new();
    for gen in 1..=MAX_RUNS as u64 + 1 {
        let mut ws = WriteStore::new();
        ws.add(block(addr(1, gen), 1), addr(2, gen));
        manifests.push(persist(&mut store, &segs, ws, gen));
    }
    // The ninth persist compacted: one combined run in a new blob (the ninth level-0
    // run was merged without being written); the eight runs the previous manifest
    // names are still in place, since appends never overwrite.
    assert_eq!(store.run_count(), 1);
    let n = manifests.len();
    assert_eq!(blobs(&manifests[n - 2]).len(), MAX_RUNS);
    let [combined] = blobs(&manifests[n - 1])[..] else {
        panic!("one combined run")
    };
    assert!(blobs(&manifests[n - 2])
        .iter()
        .all(|b| b.addr < combined.addr));
    assert!(run_files(&vfs).is_empty());
    let previous = open(&vfs, Some(&manifests[n - 2])).unwrap();
    assert_eq!(previous.live_edges(&WriteStore::new()).len(), MAX_RUNS);
    let reopened = open(&vfs, Some(&manifests[n - 1])).unwrap();
    assert_eq!(reopened.live_edges(&WriteStore::new()).len(), MAX_RUNS + 1);
    // A forced compaction rewrites even a single run (to move it out of a segment).
    let m = store.persist(&segs, &WriteStore::new(), 99, true).unwrap();
    let [moved] = blobs(&m)[..] else {
        panic!("one run")
    };
    assert!(moved.addr > combined.addr);
}

/// The random-operation run: a store, the engine's write store, and the model.
struct Harness {
    rng: SplitMix,
    vfs: SimVfs,
    segs: Segments,
    store: BackrefStore,
    ws: WriteStore,
    gen: u64,
    /// Live edges (child, parent) -> len, including the write store's.
    model: BTreeMap<(Addr, Addr), u32>,
    deleted: BTreeSet<SegmentId>,
    /// Every edge ever added: addresses are never reused, so none comes back.
    used: BTreeSet<(Addr, Addr)>,
    /// Parents freed whole (`remove_parent`): a freed node never gains an edge.
    freed: BTreeSet<Addr>,
    /// The last two manifests "written to a superblock", newest first, with the model
    /// and deletion vector as of each.
    durable: Vec<Durable>,
    /// Coverage: compactions triggered by `persist`, persists cut short by a crash.
    auto_compactions: u64,
    torn_persists: u64,
}

/// A manifest that reached a superblock, with the model and deletion vector as of it.
type Durable = (Vec<u8>, BTreeMap<(Addr, Addr), u32>, BTreeSet<SegmentId>);

const SEGMENTS: u32 = 6;
const OFFSETS: u64 = 8;

impl Harness {
    fn new(seed: u64) -> Harness {
        let vfs = SimVfs::new();
        Harness {
            rng: SplitMix(seed),
            store: open(&vfs, None).unwrap(),
            segs: segments(&vfs),
            vfs,
            ws: WriteStore::new(),
            gen: 1,
            model: BTreeMap::new(),
            deleted: BTreeSet::new(),
            used: BTreeSet::new(),
            freed: BTreeSet::new(),
            durable: Vec::new(),
            auto_compactions: 0,
            torn_persists: 0,
        }
    }

    fn random_addr(&mut self) -> Addr {
        let seg = 1 + self.rng.below(u64::from(SEGMENTS)) as u32;
        addr(seg, self.rng.below(OFFSETS) * 512)
    }

    /// Adds an edge, or (as a checkpoint or a spill does) a few at once through
    /// `add_written`, directly or through a transaction's store that is merged.
    fn add(&mut self) {
        let mut batch = Vec::new();
        let bulk = self.rng.chance(1, 3);
        for _ in 0..if bulk { 1 + self.rng.below(6) } else { 1 } {
            let (child, parent) = (self.random_addr(), self.random_addr());
            let key = (child, parent);
            let deleted =
                self.deleted.contains(&child.segment()) || self.deleted.contains(&parent.segment());
            if child == parent || deleted || self.freed.contains(&parent) || !self.used.insert(key)
            {
                continue;
            }
            let len = 1 + self.rng.below(4096) as u32;
            batch.push((block(child, len), parent));
            self.model.insert(key, len);
        }
        if !bulk {
            for (child, parent) in batch {
                self.ws.add(child, parent);
            }
        } else if self.rng.chance(1, 2) {
            self.ws.add_written(batch);
        } else {
            let mut txn = WriteStore::new();
            txn.add_written(batch);
            self.ws.merge(txn);
        }
    }

    fn random_live_edge(&mut self) -> Option<(Addr, Addr)> {
        let n = self.model.len() as u64;
        let i = self.rng.below(n) as usize;
        self.model.keys().nth(i).copied()
    }

    /// Removes a few edges, directly or through a transaction's delta that commits
    /// (merged) or aborts (dropped).
    fn remove(&mut self) {
        let mut delta = WriteStore::new();
        let through_txn = self.rng.chance(1, 2);
        let commit = self.rng.chance(2, 3);
        let mut removed = Vec::new();
        for _ in 0..1 + self.rng.below(3) {
            let Some((child, parent)) = self.random_live_edge() else {
                return;
            };
            if removed.contains(&(child, parent)) {
                continue;
            }
            removed.push((child, parent));
            if through_txn {
                delta.remove(child, parent);
            } else {
                self.ws.remove(child, parent);
            }
        }
        if through_txn && !commit {
            return; // aborted: the delta is dropped
        }
        self.ws.merge(delta);
        for key in removed {
            self.model.remove(&key);
        }
    }

    /// Frees a parent whole, directly or through a transaction's delta that commits
    /// or aborts: all its edges end at once.
    fn remove_parent(&mut self) {
        let Some((_, parent)) = self.random_live_edge() else {
            return;
        };
        if self.rng.chance(1, 2) {
            let mut delta = WriteStore::new();
            delta.remove_parent(parent);
            if self.rng.chance(1, 3) {
                return; // aborted: the delta is dropped
            }
            self.ws.merge(delta);
        } else {
            self.ws.remove_parent(parent);
        }
        self.freed.insert(parent);
        self.model.retain(|(_, p), _| *p != parent);
    }

    fn delete_segment(&mut self) {
        let seg = SegmentId(1 + self.rng.below(u64::from(SEGMENTS)) as u32);
        self.store.delete_segment(seg);
        self.deleted.insert(seg);
        self.model
            .retain(|(c, p), _| c.segment() != seg && p.segment() != seg);
    }

    /// A checkpoint whose superblock becomes durable.
    fn checkpoint(&mut self) {
        let frozen = std::mem::take(&mut self.ws);
        let runs_before = self.store.run_count();
        let m = persist(&mut self.store, &self.segs, frozen, self.gen);
        if self.store.run_count() < runs_before {
            self.auto_compactions += 1;
        }
        self.gen += 1;
        self.durable
            .insert(0, (m, self.model.clone(), self.deleted.clone()));
        self.durable.truncate(2);
        // Both superblock slots' manifests read back: nothing they name was touched.
        for (m, model, _) in &self.durable {
            let edges = open(&self.vfs, Some(m))
                .unwrap()
                .live_edges(&WriteStore::new());
            assert!(edges.len() >= model.len());
        }
    }

    /// Drops the store and opens it again from the last durable manifest (the write
    /// store's records are lost with it: the engine would replay them from its log).
    fn reopen(&mut self, vfs: SimVfs) {
        self.vfs = vfs;
        let (manifest, model, deleted) = match self.durable.first() {
            Some((m, model, deleted)) => (Some(m.clone()), model.clone(), deleted.clone()),
            None => (None, BTreeMap::new(), BTreeSet::new()),
        };
        self.store = open(&self.vfs, manifest.as_deref()).unwrap();
        self.segs = segments(&self.vfs);
        self.ws = WriteStore::new();
        self.model = model;
        self.deleted = deleted;
    }

    /// A power loss, possibly in the middle of a persist that then never reaches a
    /// superblock.
    fn crash(&mut self) {
        if self.rng.chance(1, 2) {
            let frozen = std::mem::take(&mut self.ws);
            self.vfs.set_fail_after(Some(self.rng.below(8)));
            if self
                .store
                .persist(&self.segs, &frozen, self.gen, false)
                .is_err()
            {
                self.torn_persists += 1;
            }
        }
        let after = self.vfs.crash(self.rng.next_u64());
        self.reopen(after);
    }

    fn check(&mut self, step: usize) {
        let want: Vec<Edge> = self
            .model
            .iter()
            .map(|(&(child, parent), &len)| Edge { child, parent, len })
            .collect();
        assert_eq!(self.store.live_edges(&self.ws), want, "step {step}");
        for _ in 0..4 {
            let (a, b) = (self.random_addr(), self.random_addr());
            let range = a.min(b)..Addr(a.max(b).0 + self.rng.below(2));
            let expect: Vec<Edge> = want
                .iter()
                .filter(|e| range.contains(&e.child))
                .copied()
                .collect();
            assert_eq!(
                self.store.edges(range.clone(), &self.ws),
                expect,
                "step {step}: {range:?}"
            );
            let expect: Vec<Addr> = want
                .iter()
                .filter(|e| e.child == a)
                .map(|e| e.parent)
                .collect();
            assert_eq!(
                self.store.parents(a, &self.ws),
                expect,
                "step {step}: parents of {a:?}"
            );
        }
    }

    fn step(&mut self, step: usize) {
        match self.rng.below(100) {
            0..=44 => self.add(),
            45..=59 => self.remove(),
            60..=69 => self.remove_parent(),
            70..=84 => self.checkpoint(),
            85..=88 => {
                self.store.compact(&self.segs, self.gen).unwrap();
            }
            89..=90 => self.delete_segment(),
            91..=95 => {
                let same = self.vfs.clone();
                self.reopen(same);
            }
            _ => self.crash(),
        }
        self.check(step);
    }
}

#[test]
fn random_operations_match_a_model() {
    let (mut auto_compactions, mut torn_persists) = (0, 0);
    for seed in 0..300 {
        let mut h = Harness::new(seed);
        for step in 0..600 {
            h.step(step);
        }
        assert!(h.store.run_count() <= MAX_RUNS, "seed {seed}");
        auto_compactions += h.auto_compactions;
        torn_persists += h.torn_persists;
    }
    assert!(
        auto_compactions > 100,
        "{auto_compactions} compactions by persist"
    );
    assert!(torn_persists > 100, "{torn_persists} persists cut short");
}

#[test]
fn compaction_cancels_pairs_and_purges_deleted_segments() {
    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    let mut ws = WriteStore::new();
    for i in 0..10 {
        ws.add(block(addr(1, i), 1), addr(2, i));
        ws.add(block(addr(3, i), 1), addr(4, i));
    }
    persist(&mut store, &segs, ws, 1);
    let mut ws = WriteStore::new();
    for i in 0..5 {
        ws.remove(addr(1, i), addr(2, i));
    }
    persist(&mut store, &segs, ws, 2);
    store.delete_segment(SegmentId(4));
    assert_eq!(store.record_count(), 25);
    let m = store.compact(&segs, 3).unwrap();
    segs.sync().unwrap();
    assert_eq!(store.run_count(), 1);
    assert_eq!(store.record_count(), 5);
    assert_eq!(store.deleted_segments().count(), 0);
    assert!(store.runs()[0].combined);
    let reopened = open(&vfs, Some(&m)).unwrap();
    let live: Vec<_> = reopened.live_edges(&WriteStore::new());
    assert_eq!(live.len(), 5);
    assert!(live
        .iter()
        .all(|e| e.child.segment() == SegmentId(1) && e.child.offset() >= 5));
    assert_eq!(reopened.bytes_on_disk(), store.bytes_on_disk());
}

/// CPU cost of the write store and query throughput, in memory (SimVfs). Run with
/// `cargo test --release --lib backref::tests::bench -- --ignored --nocapture`.
/// (A test rather than a `benches/` target: the store is crate-private.)
// Ignored because it measures rather than checks: it asserts nothing, and its timings
// mean something only on a quiet machine in release mode. BENCHMARKS.md ("Space")
// reports its figures and says how they were taken.
#[test]
#[ignore = "a benchmark: prints timings, asserts nothing"]
fn bench() {
    use std::time::Instant;
    const N: u64 = 1 << 20;
    let child = |i: u64| addr(1 + (i >> 20) as u32, (i & 0xF_FFFF) * 4096);
    let parent = |i: u64| addr(100 + (i >> 20) as u32, (i & 0xF_FFFF) * 8192);

    let t = Instant::now();
    let mut ws = WriteStore::new();
    for i in 0..N {
        ws.add(block(child(i), 4096), parent(i));
    }
    let add_ns = t.elapsed().as_nanos() as f64 / N as f64;
    let t = Instant::now();
    let mut pruned = ws.clone();
    for i in (0..N).step_by(2) {
        pruned.remove(child(i), parent(i));
    }
    let remove_ns = t.elapsed().as_nanos() as f64 / (N / 2) as f64;
    // What a checkpoint does: the edges of every node it wrote, in one bulk add (in
    // the order the nodes were written, children in order inside each).
    let edges: Vec<(BlockRef, Addr)> = (0..N).map(|i| (block(child(i), 4096), parent(i))).collect();
    let t = Instant::now();
    let mut bulk = WriteStore::new();
    bulk.add_written(edges);
    let bulk_ns = t.elapsed().as_nanos() as f64 / N as f64;
    drop(bulk);
    println!(
        "write store: add {add_ns:.0} ns, remove (pruning) {remove_ns:.0} ns, \
         add_written {bulk_ns:.0} ns per edge"
    );

    let vfs = SimVfs::new();
    let segs = segments(&vfs);
    let mut store = open(&vfs, None).unwrap();
    let t = Instant::now();
    persist(&mut store, &segs, ws, 1);
    println!(
        "persist {N} records: {:.0} ms, {} bytes",
        t.elapsed().as_secs_f64() * 1e3,
        store.bytes_on_disk()
    );
    let empty = WriteStore::new();
    let mut rng = SplitMix(1);
    let queries = |store: &BackrefStore, rng: &mut SplitMix, width: u64, label: &str| {
        let count = (4_000_000 / width).clamp(20_000, 2_000_000);
        let mut out = Vec::with_capacity(width as usize);
        let mut found = 0usize;
        let t = Instant::now();
        for _ in 0..count {
            let i = rng.below(N - width);
            out.clear();
            store.edges_into(child(i)..child(i + width), &empty, &mut out);
            found += out.len();
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{label}: range of {width:>4} extents: {:>9.0} queries/s ({:.1} edges each)",
            count as f64 / secs,
            found as f64 / count as f64
        );
    };
    for width in [1, 16, 256, 8192] {
        queries(&store, &mut rng, width, "1 run ");
    }
    // Eight more level-0 runs of scattered removals and additions.
    for gen in 2..=(MAX_RUNS as u64) {
        let mut ws = WriteStore::new();
        for _ in 0..10_000 {
            let i = rng.below(N);
            ws.remove(child(i), parent(i));
            ws.add(block(child(i), 4096), addr(200 + gen as u32, i * 64));
        }
        persist(&mut store, &segs, ws, gen);
    }
    assert_eq!(store.run_count(), MAX_RUNS);
    for width in [1, 16, 256, 8192] {
        queries(&store, &mut rng, width, "8 runs");
    }
    let t = Instant::now();
    let count = 1_000_000;
    let mut found = 0;
    for _ in 0..count {
        found += store.parents(child(rng.below(N)), &empty).len();
    }
    println!(
        "8 runs: parents(): {:.0} queries/s ({found} found)",
        count as f64 / t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    store.compact(&segs, 99).unwrap();
    println!(
        "compact into one run: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
}
