//! Read-only opens beside a busy writer: while one handle commits and checkpoints as
//! fast as it can (deleting segments and recycling log files as it goes), read-only
//! handles opened over and over must each see one consistent, durable state that
//! holds every commit acknowledged before the open, and `verify` through them must
//! find the store clean.

use cambium::{Options, Store};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn key(i: u64) -> Vec<u8> {
    format!("k{i:08}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("v{i}-{}", "x".repeat((i % 300) as usize)).into_bytes()
}

#[test]
fn read_only_opens_beside_a_checkpointing_writer_see_consistent_durable_states() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let writer = Store::create_with(
        &path,
        Options {
            // Small thresholds: checkpoints (and the deletions after them) all the time.
            checkpoint_wal_bytes: 64 << 10,
            checkpoint_interval: Some(Duration::from_millis(5)),
            ..Options::default()
        },
    )
    .unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (acked, stop, writer) = (acked.clone(), stop.clone(), writer.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let mut txn = writer.begin_write().unwrap();
                txn.put(&key(i), &value(i)).unwrap();
                txn.put(b"count", i.to_string().as_bytes()).unwrap();
                // Overwrites and deletes leave dead space, so segments empty and go.
                if i > 50 {
                    txn.delete(&key(i - 50)).unwrap();
                }
                txn.commit().unwrap();
                acked.store(i, Ordering::SeqCst);
                if i % 2 == 0 {
                    // Every other commit: two checkpoints land inside many reads.
                    writer.checkpoint().unwrap();
                    // Leave readers some room on a loaded machine (they start over
                    // when a checkpoint lands while they open).
                    if i % 8 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            i
        })
    };
    // 6 s, and on until the writer has made 200 commits: on a loaded machine (the
    // disk shared, a checkpoint every other commit) that may take longer (60 s at most).
    let started = Instant::now();
    let (mut opens, mut verifies) = (0, 0);
    while started.elapsed() < Duration::from_secs(6)
        || (acked.load(Ordering::SeqCst) <= 200 && started.elapsed() < Duration::from_secs(60))
    {
        let before = acked.load(Ordering::SeqCst);
        let reader = Store::open_read_only(&path).unwrap();
        opens += 1;
        let view = reader.read().unwrap();
        let count: u64 = match view.get(b"count").unwrap() {
            Some(c) => String::from_utf8(c).unwrap().parse().unwrap(),
            None => 0,
        };
        assert!(
            count >= before,
            "a reader opened after commit {before} was acknowledged sees only {count}"
        );
        // Exactly the keys of that state: count - 49 ..= count, with their values.
        let keys: Vec<(Vec<u8>, Vec<u8>)> = view
            .range(b"k".as_slice()..b"l".as_slice())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let first = count.saturating_sub(49).max(1);
        let want: Vec<(Vec<u8>, Vec<u8>)> = (first..=count).map(|i| (key(i), value(i))).collect();
        assert_eq!(keys.len(), want.len(), "state at count {count}");
        assert!(keys == want, "state at count {count} differs");
        if opens % 5 == 0 {
            let report = reader.verify().unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);
            verifies += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let last = w.join().unwrap();
    writer.close().unwrap();
    eprintln!("{opens} read-only opens, {verifies} verifies, beside {last} commits");
    assert!(
        opens > 10 && verifies > 2,
        "{opens} opens, {verifies} verifies"
    );
    assert!(last > 200, "the writer made only {last} commits");
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(
        reader.read().unwrap().get(b"count").unwrap(),
        Some(last.to_string().into_bytes())
    );
}

/// A read-only open in another process reads segments it opened long ago: while it
/// is open, the writer must not recycle an emptied segment it may still read (a
/// spare file is rewritten in place). Here the reader opens a volume holding pattern
/// A, the writer overwrites it three times with B over checkpoints (segments empty,
/// become spares, the data stream would reuse them), and the reader still reads A
/// whole. (The case occurs: spare files exist after the second pass.)
#[test]
fn a_reader_keeps_reading_segments_the_writer_emptied() {
    use cambium::volume::Volume;
    use cambium::Durability;
    const SIZE: u64 = 160 << 20;
    const WRITE: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let writer = Store::create(&path).unwrap();
    let vol = Volume::create(&writer, "v", SIZE, 4096).unwrap();
    let pattern = |fill: u8, at: u64| -> Vec<u8> {
        let mut chunk = vec![fill; WRITE];
        chunk[..8].copy_from_slice(&at.to_le_bytes());
        chunk
    };
    let pass = |fill: u8| {
        for at in (0..SIZE).step_by(WRITE) {
            vol.write_at(at, &pattern(fill, at), Durability::Deferred)
                .unwrap();
        }
        // One checkpoint finds the emptied segments, the next deletes them (or makes
        // them spares).
        writer.checkpoint().unwrap();
        writer.checkpoint().unwrap();
    };
    pass(0xA1);
    let reader = Store::open_with(
        &path,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let old = Volume::open(&reader, "v").unwrap();
    pass(0xB2);
    pass(0xB3);
    let spares = std::fs::read_dir(&path)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("spare-")
        })
        .count();
    assert!(
        spares > 0,
        "no emptied segment became a spare: the case did not occur"
    );
    pass(0xB4);
    let mut back = vec![0u8; WRITE];
    for at in (0..SIZE).step_by(WRITE) {
        old.read_at(at, &mut back)
            .unwrap_or_else(|e| panic!("the reader's read at {at}: {e}"));
        assert!(
            back == pattern(0xA1, at),
            "the reader's block at {at} changed"
        );
    }
    drop(old);
    reader.close().unwrap();
    let mut now = vec![0u8; WRITE];
    vol.read_at(0, &mut now).unwrap();
    assert!(now == pattern(0xB4, 0));
}
