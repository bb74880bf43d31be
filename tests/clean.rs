//! The cleaner, `defrag` and `shrink` on real files: space comes back, every version
//! reads the same, and sharing between versions is kept. (The model test in
//! `tests/versions.rs` interleaves them with clones, drops and power loss on the
//! simulated file system.)

mod common;

use cambium::{BlockKind, Store, VersionInfo};
use common::*;
use std::collections::BTreeMap;

/// `n` keys, every tenth with a value large enough to be stored out of line.
fn fill(store: &Store, n: usize, round: u64) -> Model {
    let mut model = Model::new();
    let mut txn = store.begin_write().unwrap();
    for i in 0..n {
        let key = format!("key{i:08}").into_bytes();
        let len = if i % 10 == 0 { 3000 } else { 100 };
        let value = vec![b'a' + (round % 26) as u8; len];
        txn.put(&key, &value).unwrap();
        model.insert(key, value);
    }
    txn.commit().unwrap();
    model
}

fn listing(store: &Store) -> BTreeMap<String, VersionInfo> {
    store
        .versions()
        .unwrap()
        .into_iter()
        .map(|v| (v.name.clone(), v))
        .collect()
}

fn check(store: &Store, version: &str, want: &Model) {
    let got = dump(&store.read_at(version).unwrap()).unwrap();
    assert!(
        diff(&got, want).is_none(),
        "{version}: {:?}",
        diff(&got, want)
    );
}

#[test]
fn shrink_brings_the_footprint_down_to_the_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // No automatic cleaning (the background thread's timing would decide how much
    // is left for `shrink` to do).
    let opts = cambium::Options {
        auto_clean_dead_percent: None,
        ..Default::default()
    };
    let store = Store::create_with(&path, opts).unwrap();
    let mut model = Model::new();
    for round in 0..6 {
        store.snapshot("main", "old").unwrap();
        model = fill(&store, 20_000, round);
        store.checkpoint().unwrap();
        store.drop_version("old").unwrap();
        store.checkpoint().unwrap();
    }
    let before = store.stats().unwrap();
    assert!(
        before.dead_bytes > before.live_bytes,
        "the workload leaves dead bytes: {before:?}"
    );
    let report = store.shrink().unwrap();
    assert!(report.bytes_moved > 0, "{report:?}");
    let after = store.stats().unwrap();
    // The WAL's files are outside the segments; everything else is live data plus a
    // few checkpoints' metadata.
    let wal = after.footprint_bytes - after.segment_bytes;
    assert!(
        after.footprint_bytes as f64 <= after.live_bytes as f64 * 1.2 + wal as f64,
        "footprint {} for {} live bytes (+{wal} WAL): {report:?}",
        after.footprint_bytes,
        after.live_bytes
    );
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(report.footprint_after, after.footprint_bytes);
    assert!(
        after.backref_runs <= 1 && after.backref_records > 0,
        "shrink compacts the back references into one run: {after:?}"
    );
    // Compaction purged every record of a freed block: one `From` per live pointer.
    assert!(
        after.backref_records < before.backref_records,
        "{before:?} {after:?}"
    );
    assert!(
        report.footprint_after < report.footprint_before,
        "{report:?}"
    );
    check(&store, "main", &model);
    assert!(store.verify().unwrap().is_clean());
    store.close().unwrap();
    let store = Store::open(&path).unwrap();
    check(&store, "main", &model);
    assert!(store.verify().unwrap().is_clean());
}

#[test]
fn clean_and_defrag_keep_every_version_and_its_sharing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("db")).unwrap();
    let mut models = BTreeMap::new();
    models.insert("s0".to_string(), fill(&store, 5_000, 0));
    store.snapshot("main", "s0").unwrap();
    for round in 1..4u64 {
        // Rewrite a part of main: the snapshots share the rest.
        let mut m = models[&format!("s{}", round - 1)].clone();
        let mut txn = store.begin_write().unwrap();
        for i in (0..5_000).step_by(3 + round as usize) {
            let key = format!("key{i:08}").into_bytes();
            let value = vec![b'0' + round as u8; if i % 7 == 0 { 2000 } else { 50 }];
            txn.put(&key, &value).unwrap();
            m.insert(key, value);
        }
        txn.commit().unwrap();
        let name = format!("s{round}");
        store.snapshot("main", &name).unwrap();
        store.branch(&name, &format!("b{round}")).unwrap();
        models.insert(format!("b{round}"), m.clone());
        models.insert(name, m);
        store.checkpoint().unwrap();
    }
    models.insert("main".into(), models["s3"].clone());
    let before = listing(&store);
    let cleaned = store.clean(0.0).unwrap();
    assert!(cleaned.bytes_moved > 0, "{cleaned:?}");
    assert_eq!(listing(&store), before, "clean changed the versions' space");
    let defragged = store.defrag(Some("s1")).unwrap();
    assert!(defragged.blocks_moved > 0, "{defragged:?}");
    let all = store.defrag(None).unwrap();
    assert!(all.blocks_moved > 0, "{all:?}");
    assert_eq!(
        listing(&store),
        before,
        "defrag changed the versions' space"
    );
    for (name, m) in &models {
        check(&store, name, m);
    }
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{report:?}");
    check_backrefs(&store, &models);
}

/// `backrefs` over every segment lists every live block exactly once (their bytes
/// add up to the live bytes), each reached by some version, with parents unless it
/// is a version's root; a block's versions are those whose tree holds it.
fn check_backrefs(store: &Store, models: &BTreeMap<String, Model>) {
    store.checkpoint().unwrap();
    let stats = store.stats().unwrap();
    let mut total = 0;
    let mut blocks = 0;
    for segment in 0..64 {
        for b in store.backrefs(segment).unwrap() {
            blocks += 1;
            total += u64::from(b.len);
            assert!(!b.versions.is_empty(), "{b:?}");
            for v in &b.versions {
                assert!(models.contains_key(v), "{b:?}");
            }
            if b.kind == BlockKind::Value {
                // The value's key is in every version listed, with a value that long.
                for v in &b.versions {
                    let value = models[v].get(&b.key).unwrap_or_else(|| panic!("{b:?}"));
                    assert!(value.len() <= b.len as usize, "{b:?}");
                }
            }
        }
    }
    assert!(blocks > 0);
    assert_eq!(
        total, stats.live_bytes,
        "the listed blocks are exactly the live ones"
    );
}

/// The soak: rounds of "snapshot, rewrite the working set, drop the snapshot",
/// each in its own open (as CLI commands are), with a clean every few rounds: the
/// footprint stays within a bound instead of growing with the rounds.
#[test]
fn footprint_stays_bounded_over_many_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    Store::create(&path).unwrap().close().unwrap();
    let mut model = Model::new();
    let mut peak = 0;
    for round in 0..24 {
        let store = Store::open(&path).unwrap();
        store.snapshot("main", "snap").unwrap();
        model = fill(&store, 8_000, round);
        store.drop_version("snap").unwrap();
        if round % 4 == 3 {
            store.clean(25.0).unwrap();
        }
        let stats = store.stats().unwrap();
        peak = peak.max(stats.segment_bytes);
        store.close().unwrap();
    }
    let store = Store::open(&path).unwrap();
    check(&store, "main", &model);
    let stats = store.stats().unwrap();
    // One round writes about 3 MiB of data; 24 rounds without cleaning leave ~70 MiB.
    assert!(
        peak < 6 * stats.live_bytes + (16 << 20),
        "segments peaked at {peak} bytes for {} live bytes",
        stats.live_bytes
    );
    assert!(store.verify().unwrap().is_clean());
}

/// The cleaner online: while `clean`, `defrag` and `shrink` run again and again, a
/// writer keeps committing to `main` and a reader keeps reading a snapshot in full.
/// The reader always sees exactly the snapshot; every commit the writer made is there
/// at the end; `verify` is clean.
#[test]
fn cleaning_runs_beside_readers_and_writers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("db")).unwrap();
    let frozen = fill(&store, 4_000, 0);
    store.snapshot("main", "frozen").unwrap();
    fill(&store, 4_000, 1);
    store.checkpoint().unwrap();
    let stop = AtomicBool::new(false);
    let written = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut model = Model::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w{:06}", i % 3_000).into_bytes();
                let value = format!("v{i}-{}", "y".repeat((i % 5) as usize * 700)).into_bytes();
                store.put(&key, &value).unwrap();
                model.insert(key, value);
                i += 1;
            }
            model
        });
        let reader = scope.spawn(|| {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                let got = dump(&store.read_at("frozen").unwrap()).unwrap();
                assert!(diff(&got, &frozen).is_none(), "{:?}", diff(&got, &frozen));
                reads += 1;
            }
            reads
        });
        for round in 0..6 {
            match round % 3 {
                0 => drop(store.clean(0.0).unwrap()),
                1 => drop(store.defrag(None).unwrap()),
                _ => drop(store.shrink().unwrap()),
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        writer.join().unwrap()
    });
    let main = dump(&store.read().unwrap()).unwrap();
    for (k, v) in &written {
        assert_eq!(main.get(k), Some(v), "{}", String::from_utf8_lossy(k));
    }
    check(&store, "frozen", &frozen);
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// After `defrag`, a version's leaves lie in key order on disk: a scan reads forwards.
#[test]
fn defrag_lays_a_versions_leaves_out_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("db")).unwrap();
    fill(&store, 30_000, 0);
    store.snapshot("main", "old").unwrap();
    // Random rewrites scatter main's leaves over the segments, in write order.
    let mut rng = Rng::new(3);
    for _ in 0..20 {
        let mut txn = store.begin_write().unwrap();
        for _ in 0..300 {
            let i = rng.below(30_000);
            txn.put(format!("key{i:08}").as_bytes(), b"rewritten")
                .unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
    }
    let leaves = |store: &Store| {
        let mut leaves: Vec<(Vec<u8>, (u32, u64))> = Vec::new();
        for segment in 0..64 {
            for b in store.backrefs(segment).unwrap() {
                if b.kind == BlockKind::Leaf && b.versions.iter().any(|v| v == "main") {
                    leaves.push((b.key, (b.segment, b.offset)));
                }
            }
        }
        leaves.sort();
        leaves
    };
    let in_order = |l: &[(Vec<u8>, (u32, u64))]| l.windows(2).all(|w| w[0].1 < w[1].1);
    assert!(
        !in_order(&leaves(&store)),
        "the rewrites scattered the leaves"
    );
    let before = listing(&store);
    store.defrag(Some("main")).unwrap();
    let after = leaves(&store);
    assert!(after.len() > 100);
    assert!(
        in_order(&after),
        "main's leaves are not in key order on disk"
    );
    assert_eq!(
        listing(&store),
        before,
        "defrag changed the versions' space"
    );
    assert!(store.verify().unwrap().is_clean());
}

/// `backrefs` between checkpoints: a block whose parent was rewritten in memory (not
/// yet checkpointed, so no back reference names the new parent) is still listed, as
/// a live block of its versions.
#[test]
fn backrefs_lists_blocks_whose_parent_is_not_written_yet() {
    let dir = tempfile::tempdir().unwrap();
    let opts = cambium::Options {
        background_checkpoints: false,
        ..Default::default()
    };
    let store = Store::create_with(dir.path().join("db"), opts).unwrap();
    fill(&store, 5_000, 0);
    store.checkpoint().unwrap();
    let leaves = |store: &Store| -> usize {
        (0..8)
            .flat_map(|s| store.backrefs(s).unwrap())
            .filter(|b| b.kind == BlockKind::Leaf && b.versions == ["main"])
            .count()
    };
    let before = leaves(&store);
    assert!(before > 20, "{before}");
    // One put: its leaf and every branch above it are rewritten in memory.
    store.put(b"key00002500", b"changed").unwrap();
    let after = leaves(&store);
    assert!(
        after + 1 >= before,
        "{before} leaves listed before the put, {after} after"
    );
}

/// A user's `shrink` and `clean` beside each other (and beside the background
/// cleaner): they take turns, and every version reads the same after.
#[test]
fn cleaners_started_together_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("db")).unwrap();
    let mut model = Model::new();
    for round in 0..4 {
        store.snapshot("main", &format!("s{round}")).unwrap();
        model = fill(&store, 5_000, round);
        store.checkpoint().unwrap();
    }
    std::thread::scope(|s| {
        let a = s.spawn(|| store.shrink());
        let b = s.spawn(|| store.clean(10.0));
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
    });
    check(&store, "main", &model);
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A data segment prepared ahead (the data stream past 3/4 of its segment) that no
/// value reaches yet: only it may take appends, not every segment made after it. (A
/// fence once took its id for the lowest that may grow, so nothing newer was ever
/// deleted: each `shrink` copied the live data and freed nothing.)
#[test]
fn shrink_deletes_what_it_empties_while_a_data_segment_is_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let opts = cambium::Options {
        auto_clean_dead_percent: None,
        ..Default::default()
    };
    let store = Store::create_with(dir.path().join("db"), opts).unwrap();
    // 50 MiB of out-of-line values: the data segment passes 3/4 of its 64 MiB.
    let mut txn = store.begin_write().unwrap();
    for i in 0..25_000u32 {
        txn.put(format!("big{i:07}").as_bytes(), &[7u8; 2100])
            .unwrap();
    }
    txn.commit().unwrap();
    // From now on only small values: dead leaves pile up in general segments.
    for round in 0..4u8 {
        let mut txn = store.begin_write().unwrap();
        for i in 0..40_000u32 {
            txn.put(format!("small{i:07}").as_bytes(), &[round; 300])
                .unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
    }
    let first = store.shrink().unwrap();
    let second = store.shrink().unwrap();
    let stats = store.stats().unwrap();
    assert!(
        second.footprint_after <= first.footprint_after + (1 << 20),
        "a second shrink grew the store from {} to {} bytes",
        first.footprint_after,
        second.footprint_after
    );
    assert!(
        stats.dead_bytes < stats.live_bytes,
        "after two shrinks: {} live bytes, {} dead",
        stats.live_bytes,
        stats.dead_bytes
    );
    assert!(store.verify().unwrap().is_clean());
}

/// Any segment number a user may give: one that is not there has no blocks (ids
/// past what an address holds once panicked).
#[test]
fn backrefs_of_a_segment_that_is_not_there_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("db")).unwrap();
    store.put(b"k", b"v").unwrap();
    store.checkpoint().unwrap();
    for segment in [999, 0x00FF_FFFF, 0x0100_0000, u32::MAX] {
        assert!(store.backrefs(segment).unwrap().is_empty(), "{segment:#x}");
    }
}

/// The longest pauses writers saw while `defrag` ran beside them.
#[derive(Debug)]
struct Pauses {
    /// The longest small commit to `main`.
    commit: std::time::Duration,
    /// The longest snapshot of `main` (made without waiting for its fsync).
    snapshot: std::time::Duration,
    /// Commits and snapshots made while `defrag` ran.
    commits: u64,
    snapshots: u64,
}

/// The keys and values of `main`'s commit `i` in [`defrag_beside_writers`]: a few
/// of 2,000 `w` keys, and `wcount`, which names the last commit a snapshot holds.
fn commit_pairs(i: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
        .map(|j| {
            let key = format!("w{:05}", (i * 4 + j) % 2_000).into_bytes();
            (key, format!("w{i}.{j}").into_bytes())
        })
        .collect();
    pairs.push((b"wcount".to_vec(), i.to_string().into_bytes()));
    pairs
}

/// `defrag` of a `keys`-key `main`, `runs` times over, beside a thread committing
/// small transactions to `main` ([`commit_pairs`]) and one snapshotting it. Each
/// snapshot's `w` keys must be exactly those of the commits up to the one its
/// `wcount` names; at the end `main` holds the fill and every commit, and the store
/// verifies clean. A small page cache makes the walk of `main`'s leaves read them
/// from the segments, as on a store much larger than its cache. Returns the longest
/// pauses of the two writers while `defrag` ran.
fn defrag_beside_writers(keys: usize, runs: usize) -> Pauses {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let opts = cambium::Options {
        auto_clean_dead_percent: None,
        cache_bytes: 4 << 20,
        ..Default::default()
    };
    let store = Store::create_with(dir.path().join("db"), opts).unwrap();
    // Small values: many leaves for the walk to go through.
    let mut filled = Model::new();
    for batch in (0..keys).collect::<Vec<_>>().chunks(100_000) {
        let mut txn = store.begin_write().unwrap();
        for &i in batch {
            let key = format!("key{i:08}").into_bytes();
            let value = format!("v{i}").into_bytes();
            txn.put(&key, &value).unwrap();
            filled.insert(key, value);
        }
        txn.commit().unwrap();
    }
    store.checkpoint().unwrap();
    let done = AtomicBool::new(false);
    let (store, done) = (&store, &done);
    let (pauses, committed) = std::thread::scope(|scope| {
        let committer = scope.spawn(|| {
            let (mut longest, mut commits) = (Duration::ZERO, 0);
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let mut txn = store.begin_write().unwrap();
                txn.set_durability(cambium::Durability::Deferred);
                for (k, v) in commit_pairs(i) {
                    txn.put(&k, &v).unwrap();
                }
                txn.commit().unwrap();
                if !done.load(Ordering::Relaxed) {
                    longest = longest.max(t.elapsed());
                    commits += 1;
                }
                i += 1;
            }
            (longest, commits, i)
        });
        let (made, dropped) = std::sync::mpsc::channel::<String>();
        let snapshotter = scope.spawn(move || {
            // The model as of commit `upto` (snapshots only see later commits).
            let (mut model, mut upto) = (Model::new(), None::<u64>);
            let (mut longest, mut snapshots) = (Duration::ZERO, 0);
            let mut n = 0;
            while !done.load(Ordering::Relaxed) {
                let name = format!("s{n}");
                let t = Instant::now();
                store
                    .snapshot_with("main", &name, cambium::Durability::Deferred)
                    .unwrap();
                if !done.load(Ordering::Relaxed) {
                    longest = longest.max(t.elapsed());
                    snapshots += 1;
                }
                let mut got = Model::new();
                for kv in store.read_at(&name).unwrap().prefix(b"w").unwrap() {
                    let (k, v) = kv.unwrap();
                    got.insert(k, v);
                }
                if let Some(count) = got.get(&b"wcount"[..]) {
                    let count: u64 = String::from_utf8_lossy(count).parse().unwrap();
                    assert!(upto.is_none_or(|u| u <= count), "{name} went back");
                    for i in upto.map_or(0, |u| u + 1)..=count {
                        model.extend(commit_pairs(i));
                    }
                    upto = Some(count);
                }
                assert!(
                    diff(&got, &model).is_none(),
                    "{name}: {:?}",
                    diff(&got, &model)
                );
                made.send(name).unwrap();
                n += 1;
                // Faster than a plan takes (tens of ms with this small cache): a
                // relocation round abandons its plan to serve a snapshot only a few
                // times, so the round (and every commit behind it) still ends.
                std::thread::sleep(Duration::from_millis(2));
            }
            (longest, snapshots)
        });
        // Drops all but the last few snapshots, on a thread of its own: a drop is
        // not lent the writer lock, and would keep the snapshots few and far between.
        let dropper = scope.spawn(move || {
            let mut kept = std::collections::VecDeque::new();
            for name in dropped {
                kept.push_back(name);
                if kept.len() > 8 {
                    store.drop_version(&kept.pop_front().unwrap()).unwrap();
                }
            }
        });
        for _ in 0..runs {
            let report = store.defrag(Some("main")).unwrap();
            assert!(report.blocks_moved > 0, "{report:?}");
        }
        done.store(true, Ordering::Relaxed);
        let (snapshot, snapshots) = snapshotter.join().unwrap();
        dropper.join().unwrap();
        let (commit, commits, made) = committer.join().unwrap();
        let pauses = Pauses {
            commit,
            snapshot,
            commits,
            snapshots,
        };
        (pauses, made)
    });
    let mut want = filled;
    for i in 0..committed {
        want.extend(commit_pairs(i));
    }
    check(store, "main", &want);
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{report:?}");
    pauses
}

/// `defrag` goes on beside commits to and snapshots of the version it moves, and
/// none of them loses or mixes up data. (How long they wait is measured by
/// `defrag_writer_pauses`, not asserted: timing is too noisy for a test.)
#[test]
fn defrag_runs_beside_commits_and_snapshots() {
    let pauses = defrag_beside_writers(1_000_000, 2);
    assert!(pauses.commits > 0 && pauses.snapshots > 0, "{pauses:?}");
}

/// Prints the longest commit and snapshot pauses beside `defrag` of a large tree:
/// `cargo test --release --test clean defrag_writer_pauses -- --ignored --nocapture`.
/// `CAMBIUM_DEFRAG_KEYS` sets the tree's size (default 2,000,000 keys).
#[test]
#[ignore = "a measurement, not a check"]
fn defrag_writer_pauses() {
    let keys = std::env::var("CAMBIUM_DEFRAG_KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(2_000_000);
    let p = defrag_beside_writers(keys, 3);
    println!(
        "defrag of {keys} keys: longest commit {:?}, longest snapshot {:?} ({} commits, {} snapshots)",
        p.commit, p.snapshot, p.commits, p.snapshots
    );
}

/// Two volumes written at the same time share their data segments; dropping one
/// leaves them half dead, under the store-wide threshold of the automatic cleaner
/// (more than half the segment bytes dead). The drop cleans them: the space comes
/// back, and the other volume reads the same. Both ways a drop runs: in a process
/// of its own (the CLI's, on close) and through a store that stays open (a server's
/// `reclaim_dropped`).
#[test]
fn a_drop_gives_back_the_space_of_segments_it_left_half_dead() {
    use cambium::volume::Volume;
    use cambium::Durability;
    for served in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::create(&path).unwrap();
        let a = Volume::create(&store, "a", 16 << 20, 4096).unwrap();
        let b = Volume::create(&store, "b", 16 << 20, 4096).unwrap();
        let mut rng = Rng::new(5);
        let mut image = Vec::new();
        for i in 0..16u64 {
            let block = rng.bytes(1 << 20);
            a.write_at(i << 20, &block, Durability::Deferred).unwrap();
            image.extend_from_slice(&block);
            b.write_at(i << 20, &rng.bytes(1 << 20), Durability::Deferred)
                .unwrap();
        }
        drop((a, b));
        store.close().unwrap();
        let store = Store::open(&path).unwrap();
        let before = store.stats().unwrap();
        Volume::drop_volume(&store, "b").unwrap();
        let store = if served {
            store.reclaim_dropped().unwrap();
            store
        } else {
            store.close().unwrap();
            Store::open(&path).unwrap()
        };
        let after = store.stats().unwrap();
        assert!(
            after.dead_bytes * 10 < after.segment_bytes,
            "served {served}: {} dead of {} (before the drop: {} of {})",
            after.dead_bytes,
            after.segment_bytes,
            before.dead_bytes,
            before.segment_bytes
        );
        assert!(after.segment_bytes < before.segment_bytes * 6 / 10);
        let a = Volume::open(&store, "a").unwrap();
        let mut back = vec![0u8; image.len()];
        a.read_at(0, &mut back).unwrap();
        assert!(back == image, "served {served}: a reads the same");
        drop(a);
        assert!(store.verify().unwrap().is_clean());
        store.close().unwrap();
    }
}
