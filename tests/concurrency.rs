//! Commits, reads and checkpoints at the same time.
//!
//! Method: several writer threads commit transactions that each set two keys of a
//! pair to the same counter value (plus some filler), with tiny checkpoint
//! thresholds so background checkpoints run constantly underneath them. Reader
//! threads take views and check that both keys of every pair agree (atomicity and
//! snapshot isolation) and that a view never goes backwards in LSN. At the end the
//! store is verified, closed, reopened, and every pair's final value is checked.

use cambium::{Durability, Options, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PAIRS: u32 = 50;
const WRITERS: u32 = 3;
const TXNS_PER_WRITER: u32 = 300;

fn pair_keys(p: u32) -> (Vec<u8>, Vec<u8>) {
    (
        format!("pair/{p:04}/a").into_bytes(),
        format!("pair/{p:04}/b").into_bytes(),
    )
}

#[test]
fn commits_reads_and_checkpoints_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = Options {
        checkpoint_wal_bytes: 16 << 10,
        checkpoint_dirty_bytes: 64 << 10,
        checkpoint_interval: Some(Duration::from_millis(5)),
        cache_bytes: 1 << 20,
        ..Options::default()
    };
    let store = Store::create_with(&path, opts.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last_lsn = 0;
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let view = store.read().unwrap();
                    assert!(view.lsn() >= last_lsn, "a newer view went back in time");
                    last_lsn = view.lsn();
                    for p in (0..PAIRS).step_by(7) {
                        let (a, b) = pair_keys(p);
                        assert_eq!(
                            view.get(&a).unwrap(),
                            view.get(&b).unwrap(),
                            "torn pair {p}"
                        );
                        checks += 1;
                    }
                    let n = view.prefix(b"pair/").unwrap().count();
                    assert_eq!(n % 2, 0, "a scan saw half a pair");
                }
                checks
            })
        })
        .collect();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for t in 0..TXNS_PER_WRITER {
                    let mut txn = store.begin_write().unwrap();
                    if t % 5 == 0 {
                        txn.set_durability(Durability::Deferred);
                    }
                    let p = (w * 7 + t * 13) % PAIRS;
                    let value = format!("{w}-{t}").into_bytes();
                    let (a, b) = pair_keys(p);
                    txn.put(&a, &value).unwrap();
                    txn.put(&b, &value).unwrap();
                    for f in 0..5 {
                        let filler = format!("filler/{w}/{:06}", (t * 5 + f) % 400);
                        if t % 3 == 0 {
                            txn.delete(filler.as_bytes()).unwrap();
                        } else {
                            txn.put(filler.as_bytes(), &vec![b'x'; (t % 90) as usize])
                                .unwrap();
                        }
                    }
                    txn.commit().unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }

    let generations = store.stats().unwrap().generation;
    assert!(
        generations > 5,
        "background checkpoints did not run underneath ({generations})"
    );
    let final_state: Vec<(Vec<u8>, Vec<u8>)> = store
        .read()
        .unwrap()
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    store.close().unwrap();

    let store = Store::open_with(&path, opts).unwrap();
    let reopened: Vec<(Vec<u8>, Vec<u8>)> = store
        .read()
        .unwrap()
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(final_state, reopened);
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Snapshots are immutable while everything moves around them: a writer keeps
/// changing `main` and a branch, takes snapshots and drops old ones; background
/// checkpoints and drop walks run constantly; readers compare random live snapshots
/// with what they held when taken.
#[test]
fn snapshots_stay_fixed_under_writes_checkpoints_and_drops() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    type Model = BTreeMap<Vec<u8>, Vec<u8>>;
    /// Live snapshots and the contents each must keep.
    type Taken = Arc<Mutex<Vec<(String, Arc<Model>)>>>;

    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        checkpoint_wal_bytes: 16 << 10,
        checkpoint_dirty_bytes: 32 << 10,
        checkpoint_interval: Some(Duration::from_millis(3)),
        cache_bytes: 64 << 10,
        ..Options::default()
    };
    let store = Store::create_with(dir.path().join("db"), opts).unwrap();
    let snapshots: Taken = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (store, snapshots, stop) = (store.clone(), snapshots.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut checked = 0u64;
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let pick = {
                        let s = snapshots.lock().unwrap();
                        (!s.is_empty()).then(|| s[i % s.len()].clone())
                    };
                    i += 1;
                    let Some((name, want)) = pick else { continue };
                    let view = match store.read_at(&name) {
                        Ok(v) => v,
                        Err(cambium::Error::VersionNotFound(_)) => continue, // dropped
                        Err(e) => panic!("read_at {name}: {e}"),
                    };
                    let got: Model = view.iter().unwrap().map(|kv| kv.unwrap()).collect();
                    assert!(got == *want, "snapshot {name} changed");
                    checked += 1;
                }
                checked
            })
        })
        .collect();

    let mut main = Model::new();
    let mut side = Model::new();
    store.branch("main", "side").unwrap();
    for round in 0..120u32 {
        for (branch, model) in [("main", &mut main), ("side", &mut side)] {
            let mut txn = store.begin_write_on(branch).unwrap();
            txn.set_durability(Durability::Deferred);
            for j in 0..40u32 {
                let k = format!("k{:05}", (round * 7919 + j * 104_729) % 5000).into_bytes();
                if j % 5 == 4 {
                    txn.delete(&k).unwrap();
                    model.remove(&k);
                } else {
                    let v = format!("{branch}-{round}-{j}")
                        .into_bytes()
                        .repeat(1 + (j as usize % 4));
                    txn.put(&k, &v).unwrap();
                    model.insert(k, v);
                }
            }
            txn.commit().unwrap();
        }
        let name = format!("snap{round}");
        let (source, model) = if round % 2 == 0 {
            ("main", &main)
        } else {
            ("side", &side)
        };
        store.snapshot(source, &name).unwrap();
        let mut s = snapshots.lock().unwrap();
        s.push((name, Arc::new(model.clone())));
        if s.len() > 8 {
            let (old, _) = s.remove(round as usize % 8);
            drop(s);
            store.drop_version(&old).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checked > 0, "the readers checked nothing");
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let snaps = snapshots.lock().unwrap().clone();
    let path = store.path().to_path_buf();
    store.close().unwrap();
    let store = Store::open(&path).unwrap();
    for (name, want) in snaps {
        let got: Model = store
            .read_at(&name)
            .unwrap()
            .iter()
            .unwrap()
            .map(|kv| kv.unwrap())
            .collect();
        assert!(got == *want, "snapshot {name} changed across reopen");
    }
}

/// A snapshot of a volume taken while batches of writes go on holds every batch
/// answered before it, and of the batch in flight at most a prefix: the writer,
/// asked for the writer lock by the snapshot, commits what it has mapped so far and
/// lets the snapshot in (`Volume::put_written_yielding`), so the snapshot waits for
/// one write, not for a whole batch. Checked here: each snapshot holds exactly the
/// first `n` writes of the sequence, `n` at least every answered batch's; and some
/// batch was split (more commits than batches and snapshots).
#[test]
fn volume_snapshots_land_between_writes_of_a_batch() {
    use cambium::volume::Volume;
    use std::sync::atomic::AtomicU64;
    const BATCH: u64 = 32;
    const BATCHES: u64 = 200;
    const BS: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let vol = Volume::create(&store, "disk", BATCH * BATCHES * BS, BS as u32).unwrap();
    // Block `i` (the i-th write of the sequence) holds `i + 1` in every word.
    let content = |i: u64| -> Vec<u8> { (0..BS / 8).flat_map(|_| (i + 1).to_le_bytes()).collect() };
    let lsn_before = store.stats().unwrap().last_lsn;
    let answered = AtomicU64::new(0);
    let mut snaps: Vec<(String, u64)> = Vec::new();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for b in 0..BATCHES {
                let blocks: Vec<Vec<u8>> = (b * BATCH..(b + 1) * BATCH).map(content).collect();
                let writes: Vec<(u64, &[u8])> = blocks
                    .iter()
                    .enumerate()
                    .map(|(j, data)| ((b * BATCH + j as u64) * BS, &data[..]))
                    .collect();
                vol.write_many(&writes, Durability::Deferred).unwrap();
                answered.store((b + 1) * BATCH, Ordering::Release);
            }
        });
        while !writer.is_finished() {
            let before = answered.load(Ordering::Acquire);
            let name = format!("s{}", snaps.len());
            Volume::snapshot_with(&store, "disk", &name, Durability::Deferred).unwrap();
            snaps.push((name, before));
            std::thread::sleep(Duration::from_micros(300));
        }
        writer.join().unwrap();
    });
    let commits = store.stats().unwrap().last_lsn - lsn_before;
    let splits = commits.saturating_sub(BATCHES + snaps.len() as u64);
    assert!(
        splits > 0,
        "no batch was split for a snapshot ({commits} commits, {BATCHES} batches, {} snapshots)",
        snaps.len()
    );
    // Every snapshot of a sample: the first `n` writes, and none after them.
    let step = (snaps.len() / 24).max(1);
    let mut image = vec![0u8; (BATCH * BATCHES * BS) as usize];
    for (name, before) in snaps.iter().step_by(step) {
        let snap = Volume::open(&store, name).unwrap();
        snap.read_at(0, &mut image).unwrap();
        let present = |i: u64| {
            let block = &image[(i * BS) as usize..((i + 1) * BS) as usize];
            if block.iter().all(|&b| b == 0) {
                false
            } else {
                assert!(
                    block == content(i),
                    "{name}: block {i} holds something else"
                );
                true
            }
        };
        let n = (0..BATCH * BATCHES).take_while(|&i| present(i)).count() as u64;
        assert!(
            n >= *before,
            "{name}: holds {n} writes, but {before} were answered before it"
        );
        let stray = (n..BATCH * BATCHES).find(|&i| present(i));
        assert!(
            stray.is_none(),
            "{name}: write {stray:?} is in it, but write {n} is not"
        );
    }
    store.close().unwrap();
}
