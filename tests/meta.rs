//! Metadata that grows with change, pending deletions that survive the process, and
//! drops that always finish.
//!
//! - `meta_bytes_per_checkpoint_are_flat`: the same small change, checkpointed at
//!   10, 300 and 1,000 versions, writes about the same metadata bytes (the delta
//!   chain; base rewrites amortised over many checkpoints).
//! - `dead_segment_is_deleted_by_close` and `pending_deletion_runs_at_open`: a
//!   segment made entirely dead goes away at close, or at the next open, on a real
//!   directory through the public API.
//! - `crash_around_pending_deletion`: power loss at every I/O operation of such a
//!   close (SimVfs); nothing durable is lost, `verify` is clean, and the segment goes
//!   once a later close completes.
//! - `interrupted_drop_finishes_at_close`: a crash in the middle of a drop leaves a
//!   drop queue in the metadata; reopen, one ordinary put, close, and the live bytes
//!   are those of a store whose drop completed.

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Durability, Options, Store};
use common::*;

/// A value of `len` bytes, all `fill`.
fn value(fill: u8, len: usize) -> Vec<u8> {
    vec![fill; len]
}

/// Average metadata bytes per checkpoint over `rounds` one-key checkpoints on a
/// 50-key store with `versions` snapshots.
fn meta_bytes_per_checkpoint(versions: usize, rounds: usize) -> f64 {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let mut txn = store.begin_write().unwrap();
    for i in 0..50 {
        txn.put(format!("key-{i:03}").as_bytes(), &value(1, 40))
            .unwrap();
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    for v in 1..versions {
        store
            .snapshot_with("main", &format!("snap-{v:04}"), Durability::Deferred)
            .unwrap();
    }
    // The checkpoint that records the new versions, then the measured ones.
    store.checkpoint().unwrap();
    let mut total = 0u64;
    for round in 0..rounds {
        let key = format!("key-{:03}", round % 50);
        store.put(key.as_bytes(), &value(round as u8, 40)).unwrap();
        store.checkpoint().unwrap();
        let bytes = store.stats().unwrap().meta_bytes_last_checkpoint;
        assert!(bytes > 0);
        total += bytes;
    }
    assert_eq!(store.stats().unwrap().versions, versions as u64);
    verify_clean(&store, "after the measured checkpoints").unwrap();
    drop(store);
    let reopened = open_sim(&vfs).unwrap();
    verify_clean(&reopened, "after reopen").unwrap();
    total as f64 / rounds as f64
}

#[test]
fn meta_bytes_per_checkpoint_are_flat() {
    // Enough rounds that the 10-version store rewrites its base many times and the
    // 1,000-version store at least once.
    let rounds = 600;
    let small = meta_bytes_per_checkpoint(10, rounds);
    let mid = meta_bytes_per_checkpoint(300, rounds);
    let large = meta_bytes_per_checkpoint(1000, rounds);
    eprintln!(
        "metadata bytes per checkpoint: 10 versions {small:.0}, 300 {mid:.0}, 1000 {large:.0}"
    );
    assert!(mid < 2.0 * small, "300 versions: {mid:.0} vs {small:.0}");
    assert!(
        large < 2.0 * small,
        "1000 versions: {large:.0} vs {small:.0}"
    );
}

/// The first data segment: a new store's first checkpoint creates general segment 1,
/// the first value extent data segment 2.
const SEGMENT_ONE: &str = "seg-00000002.dat";
/// Three values of 24 MiB fill the first data segment past its 64 MiB target.
const BIG: usize = 24 << 20;
const KEYS: [&[u8]; 3] = [b"a", b"b", b"c"];

/// Fills the first data segment (`SEGMENT_ONE`) with values, snapshots them,
/// overwrites every one (the new values go to later segments) and checkpoints: that
/// segment is then kept alive only by the snapshot.
fn fill_snapshot_overwrite(store: &Store) {
    for k in KEYS {
        store.put(k, &value(1, BIG)).unwrap();
    }
    store.checkpoint().unwrap();
    store.snapshot("main", "old").unwrap();
    for k in KEYS {
        store.put(k, &value(2, BIG)).unwrap();
    }
    store.checkpoint().unwrap();
}

fn check_new_values(store: &Store) {
    for k in KEYS {
        assert_eq!(store.get(k).unwrap(), Some(value(2, BIG)));
    }
}

fn no_bg() -> Options {
    Options {
        background_checkpoints: false,
        ..Default::default()
    }
}

#[test]
fn dead_segment_is_deleted_by_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::create_with(&path, no_bg()).unwrap();
    fill_snapshot_overwrite(&store);
    assert!(path.join(SEGMENT_ONE).exists());
    let before = store.stats().unwrap().segment_bytes;
    store.drop_version("old").unwrap();
    // As the CLI does: one process, no background thread, close.
    store.close().unwrap();
    assert!(
        !path.join(SEGMENT_ONE).exists(),
        "the dead segment outlived the close"
    );
    let store = Store::open_with(&path, no_bg()).unwrap();
    assert!(!path.join(SEGMENT_ONE).exists());
    check_new_values(&store);
    verify_clean(&store, "reopen").unwrap();
    // The two old values segment 1 held alone came back (less the few KiB of
    // metadata and nodes written since).
    let after = store.stats().unwrap().segment_bytes;
    assert!(
        after + 2 * BIG as u64 <= before + (64 << 10),
        "{before} -> {after} bytes"
    );
}

#[test]
fn pending_deletion_runs_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let opts = Options {
        checkpoint_on_close: false,
        ..no_bg()
    };
    let store = Store::create_with(&path, opts.clone()).unwrap();
    fill_snapshot_overwrite(&store);
    // A reader older than the drop keeps segment 1 reachable in this process, so the
    // checkpoints below can only record it as pending.
    let reader = store.read_at("old").unwrap();
    store.drop_version("old").unwrap();
    store.checkpoint().unwrap();
    store.put(b"later", b"x").unwrap();
    store.checkpoint().unwrap();
    assert!(path.join(SEGMENT_ONE).exists());
    assert_eq!(reader.get(b"a").unwrap(), Some(value(1, BIG)));
    store.close().unwrap();
    drop(reader);
    assert!(path.join(SEGMENT_ONE).exists());
    // Emptied two generations ago: neither slot reaches it, the open deletes it.
    let store = Store::open_with(&path, opts).unwrap();
    assert!(
        !path.join(SEGMENT_ONE).exists(),
        "the open left a pending segment that no slot reaches"
    );
    check_new_values(&store);
    verify_clean(&store, "reopen").unwrap();
}

fn has_segment_one(vfs: &SimVfs) -> bool {
    vfs.names().iter().any(|n| n == SEGMENT_ONE)
}

#[test]
fn crash_around_pending_deletion() {
    // Filling the segment is the costly part (144 MiB of values): done once, then
    // every crash point starts from a copy of that file system, opens the store and
    // drops the snapshot that kept segment 1 alive.
    let filled = {
        let vfs = SimVfs::new();
        let store = create_sim(&vfs);
        fill_snapshot_overwrite(&store);
        vfs.crash_keep_all()
    };
    let dead_segment = |vfs: &SimVfs| {
        let store = open_sim(vfs).unwrap();
        store.drop_version("old").unwrap();
        store
    };
    let ops = {
        let vfs = filled.fork();
        let store = dead_segment(&vfs);
        assert!(has_segment_one(&vfs), "segment 1 is there until the close");
        let before = vfs.op_count();
        store.close().unwrap();
        assert!(!has_segment_one(&vfs));
        vfs.op_count() - before
    };
    assert!(ops > 0);
    let mut points = 0;
    for k in 0..=ops {
        for crash_seed in [k, k + 1000] {
            let vfs = filled.fork();
            let store = dead_segment(&vfs);
            vfs.set_fail_after(Some(k));
            let closed = store.close();
            let image = vfs.crash(crash_seed);
            let when = format!("crash at op {k} of {ops} (seed {crash_seed}, close {closed:?})");
            let store = open_sim(&image).unwrap_or_else(|e| panic!("{when}: open: {e}"));
            check_new_values(&store);
            assert!(store.read_at("old").is_err(), "{when}: the drop was lost");
            verify_clean(&store, &when).unwrap();
            store.close().unwrap();
            assert!(
                !has_segment_one(&image),
                "{when}: segment 1 outlived a clean close"
            );
            let store = open_sim(&image).unwrap();
            check_new_values(&store);
            verify_clean(&store, &format!("{when}, reopened")).unwrap();
            points += 1;
        }
    }
    eprintln!("{points} crash points around a pending deletion");
}

/// A store with a version whose drop is left unfinished in a durable checkpoint, and
/// the keys of `main`.
fn build_half_dropped(vfs: &SimVfs) -> Store {
    let opts = Options {
        // Every commit past a few KiB of WAL checkpoints (inline, no thread).
        checkpoint_wal_bytes: 4 << 10,
        ..sim_options(vfs)
    };
    let store = Store::create_with(SIM_PATH, opts).unwrap();
    let mut rng = Rng::new(7);
    for batch in 0..4 {
        let mut txn = store.begin_write().unwrap();
        for i in 0..500 {
            txn.put(format!("k-{batch}-{i:04}").as_bytes(), &rng.bytes(60))
                .unwrap();
        }
        txn.commit().unwrap();
    }
    store.checkpoint().unwrap();
    store.branch("main", "doomed").unwrap();
    let mut txn = store.begin_write_on("doomed").unwrap();
    for i in 0..2000 {
        txn.put(
            format!("k-{}-{:04}", i % 4, i / 4).as_bytes(),
            &rng.bytes(60),
        )
        .unwrap();
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    store.drop_version("doomed").unwrap();
    assert!(store.drop_step(2).unwrap(), "the drop finished in one step");
    // A commit that crosses the WAL threshold checkpoints the half-done drop.
    let mut txn = store.begin_write().unwrap();
    for i in 0..100 {
        txn.put(format!("w-{i:03}").as_bytes(), &value(3, 80))
            .unwrap();
    }
    txn.commit().unwrap();
    assert!(store.stats().unwrap().drop_pending_nodes > 0);
    store
}

#[test]
fn interrupted_drop_finishes_at_close() {
    let after_put_and_close = |vfs: &SimVfs| -> (u64, u64) {
        let store = open_sim(vfs).unwrap();
        store.put(b"one-more", b"put").unwrap();
        store.close().unwrap();
        let store = open_sim(vfs).unwrap();
        verify_clean(&store, "after the close").unwrap();
        let s = store.stats().unwrap();
        assert_eq!(s.drop_pending_nodes, 0, "the drop did not finish");
        let referenced: u64 = store
            .versions()
            .unwrap()
            .iter()
            .map(|v| v.referenced_bytes)
            .sum();
        (s.live_bytes, referenced)
    };

    // Crashed mid-drop: the checkpointed drop queue is all that is left of it.
    let vfs = SimVfs::new();
    let store = build_half_dropped(&vfs);
    let image = vfs.crash_drop_all();
    drop(store);
    {
        // Read-only: nothing is finished or written, the image stays as it is.
        let opts = Options {
            read_only: true,
            ..sim_options(&image)
        };
        let store = Store::open_with(SIM_PATH, opts).unwrap();
        assert!(store.stats().unwrap().drop_pending_nodes > 0);
        verify_clean(&store, "after the crash").unwrap();
    }
    let (crashed_live, crashed_referenced) = after_put_and_close(&image);

    // The same, with the drop completed before the power loss.
    let vfs = SimVfs::new();
    let store = build_half_dropped(&vfs);
    store.finish_drops().unwrap();
    store.checkpoint().unwrap();
    let image = vfs.crash_drop_all();
    drop(store);
    let (done_live, done_referenced) = after_put_and_close(&image);

    assert_eq!(
        crashed_live, crashed_referenced,
        "live bytes hold dead nodes"
    );
    assert_eq!(done_live, done_referenced);
    assert_eq!(crashed_live, done_live);
}

/// The newest superblock slot's metadata reference: (segment file, offset, length).
fn newest_meta(vfs: &SimVfs) -> (String, u64, u32) {
    let sb = vfs.read_file("superblock").unwrap();
    let slot = [0usize, 4096]
        .into_iter()
        .max_by_key(|&o| u64::from_le_bytes(sb[o + 16..o + 24].try_into().unwrap()))
        .unwrap();
    blockref(&sb[slot + 40..slot + 56])
}

fn blockref(b: &[u8]) -> (String, u64, u32) {
    let addr = u64::from_le_bytes(b[0..8].try_into().unwrap());
    let len = u32::from_le_bytes(b[8..12].try_into().unwrap());
    (
        format!("seg-{:08x}.dat", addr >> 40),
        addr & ((1 << 40) - 1),
        len,
    )
}

/// A store on `vfs` holding `key-000` to `key-199` (40-byte values), committed.
fn store_of_200_keys(vfs: &SimVfs) -> Store {
    let store = create_sim(vfs);
    let mut txn = store.begin_write().unwrap();
    for i in 0..200 {
        txn.put(format!("key-{i:03}").as_bytes(), &value(1, 40))
            .unwrap();
    }
    txn.commit().unwrap();
    store
}

#[test]
fn damaged_chain_blob_is_reported() {
    let vfs = SimVfs::new();
    let store = store_of_200_keys(&vfs);
    // A catalog big enough that one small change is a delta, not a new base (the
    // delta also carries the back-reference manifest).
    for i in 0..20 {
        store.snapshot("main", &format!("snap-{i}")).unwrap();
    }
    store.checkpoint().unwrap();
    store.put(b"key-000", b"small change").unwrap();
    store.checkpoint().unwrap();
    // The newest blob is a delta; its predecessor (the base) is in both slots' chains.
    let (seg, off, _) = newest_meta(&vfs);
    let tip = vfs.read_file(&seg).unwrap();
    let at = off as usize;
    assert_eq!(tip[at + 4], 2, "expected a delta blob");
    let (base_seg, base_off, base_len) = blockref(&tip[at + 32..at + 48]);
    assert!(base_len > 0);
    assert!(vfs.corrupt(&base_seg, base_off + u64::from(base_len) / 2, 0x40));
    let report = store.verify().unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("metadata")),
        "{:?}",
        report.problems
    );
    drop(store);
    // Neither slot's chain reads back: open refuses with a typed error.
    let err = open_sim(&vfs.crash_keep_all()).expect_err("opened a store whose chain is broken");
    assert!(err.is_corruption(), "{err:?}");
}

/// Back-reference runs are blobs in the segments: a checkpoint writes no
/// `backref-*` file, and a damaged run blob is a corruption error at open (read-only
/// or writable), never a panic.
#[test]
fn runs_are_segment_blobs_and_a_damaged_one_is_corruption() {
    let vfs = SimVfs::new();
    let store = store_of_200_keys(&vfs);
    store.checkpoint().unwrap();
    store.put(b"key-000", b"small change").unwrap();
    store.checkpoint().unwrap();
    let names = vfs.names();
    assert!(
        !names.iter().any(|n| n.starts_with("backref-")),
        "{names:?}"
    );
    let stats = store.stats().unwrap();
    assert!(
        stats.backref_runs >= 2 && stats.backref_bytes > 0,
        "{} runs, {} bytes",
        stats.backref_runs,
        stats.backref_bytes
    );
    assert!(store.verify().unwrap().problems.is_empty());
    store.close().unwrap();

    // The newest run appended is one the newest manifest names: damage it (by its
    // magic, so the test needs no manifest parser).
    let mut newest = None;
    for name in names.iter().filter(|n| n.starts_with("seg-")) {
        let bytes = vfs.read_file(name).unwrap();
        if let Some(at) = bytes.windows(8).rposition(|w| w == b"cmbBRrun") {
            newest = Some((name.clone(), at as u64));
        }
    }
    let (seg, at) = newest.expect("a run blob in a segment");
    assert!(vfs.corrupt(&seg, at + 20, 0x08));
    let after = vfs.crash_keep_all();
    for read_only in [true, false] {
        let opts = Options {
            read_only,
            ..sim_options(&after)
        };
        let err = Store::open_with(common::SIM_PATH, opts)
            .expect_err("opened a store whose back references are damaged");
        assert!(err.is_corruption(), "{err:?}");
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}

/// A segment the cleaner empties that still holds blobs of the current runs is
/// deleted all the same: the checkpoint that would delete it compacts the runs into a
/// new blob elsewhere (while either slot names them, the segment stays).
#[test]
fn runs_move_out_of_a_segment_the_cleaner_empties() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    for round in 1..=2 {
        let mut txn = store.begin_write().unwrap();
        for i in 0..200 {
            txn.put(format!("key-{i:03}").as_bytes(), &value(round, 40))
                .unwrap();
        }
        txn.commit().unwrap();
        store.checkpoint().unwrap();
    }
    // Both checkpoints' runs (no compaction yet) are in segment 1, with its nodes.
    let one = "seg-00000001.dat";
    let bytes = vfs.read_file(one).unwrap();
    let runs = bytes.windows(8).filter(|w| w == b"cmbBRrun").count();
    assert!(runs >= 2, "{runs} run blobs in {one}");
    // `clean`, not `shrink`: shrink compacts the runs anyway.
    store.clean(0.0).unwrap();
    assert!(
        !vfs.names().iter().any(|n| n == one),
        "{one} outlived the cleaning: {:?}",
        vfs.names()
    );
    assert!(store.verify().unwrap().problems.is_empty());
    store.close().unwrap();
    let store = open_sim(&vfs.crash_keep_all()).unwrap();
    assert!(store.stats().unwrap().backref_runs >= 1);
    assert_eq!(store.get(b"key-007").unwrap(), Some(value(2, 40)));
    assert!(store.verify().unwrap().problems.is_empty());
}

/// A `backref-*.run` file (runs were files before format version 4) breaks nothing:
/// a read-only open ignores it, a writable open removes it.
#[test]
fn stray_run_files_are_ignored_then_removed() {
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    store.put(b"k", b"v").unwrap();
    store.close().unwrap();
    let stray = "backref-0000000000000007.run";
    vfs.write_file(stray, b"a run file of an older layout");
    let read_only = Options {
        read_only: true,
        ..sim_options(&vfs)
    };
    let store = Store::open_with(common::SIM_PATH, read_only).unwrap();
    assert_eq!(store.get(b"k").unwrap(), Some(b"v".to_vec()));
    drop(store);
    assert!(vfs.names().iter().any(|n| n == stray));
    let store = open_sim(&vfs).unwrap();
    assert!(!vfs.names().iter().any(|n| n == stray), "{:?}", vfs.names());
    assert!(store.verify().unwrap().problems.is_empty());
}
