//! Which way a transaction past 16 MiB of operations commits: by checkpoint when the
//! nodes that checkpoint writes weigh about what its operations do (sorted input
//! filling new leaves), through the WAL when it dirtied many times its size in
//! existing leaves (random inserts into a larger tree), so that later transactions
//! add to those leaves before they are written.

use cambium::{Options, Store};

fn opts() -> Options {
    Options {
        // Nothing but the commits themselves checkpoints.
        background_checkpoints: false,
        checkpoint_interval: None,
        // So that the reopen below replays the logged transaction.
        checkpoint_on_close: false,
        ..Options::default()
    }
}

const VALUE: [u8; 150] = [0x5a; 150];

/// A pseudo-random 24-byte key (SplitMix64 of `i`, twice).
fn random_key(i: u64) -> Vec<u8> {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    format!("{:016x}{:08x}", mix(i), mix(!i) as u32).into_bytes()
}

#[test]
fn sorted_input_commits_by_checkpoint_and_random_inserts_are_logged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::create_with(dir.path().join("s"), opts()).expect("create");

    // 120k sorted pairs, ~21 MiB of operations: new leaves, written once.
    let before = store.stats().expect("stats");
    let mut txn = store.begin_write().expect("txn");
    for i in 0..120_000u64 {
        txn.put(format!("sorted:{i:017}").as_bytes(), &VALUE)
            .expect("put");
    }
    txn.commit().expect("commit");
    let after = store.stats().expect("stats");
    assert_eq!(
        after.generation,
        before.generation + 1,
        "sorted input should commit by a checkpoint of its own"
    );
    // The WAL holds only the checkpoint-commit marker (docs/FORMAT.md).
    assert!(
        after.wal_bytes < 4096,
        "nothing of it should be in the WAL ({} bytes)",
        after.wal_bytes
    );

    // 300k random pairs under their own prefix, committed in small transactions and
    // checkpointed: a tree of ~10k leaves.
    for chunk in 0..30u64 {
        let mut txn = store.begin_write().expect("txn");
        for i in chunk * 10_000..(chunk + 1) * 10_000 {
            txn.put(&random_key(i), &VALUE).expect("put");
        }
        txn.commit().expect("commit");
    }
    store.checkpoint().expect("checkpoint");

    // 120k more random pairs in one transaction: they touch most of those leaves,
    // copying several times the transaction's own size.
    let before = store.stats().expect("stats");
    let mut txn = store.begin_write().expect("txn");
    for i in 1_000_000..1_120_000u64 {
        txn.put(&random_key(i), &VALUE).expect("put");
    }
    txn.commit().expect("commit");
    let after = store.stats().expect("stats");
    assert_eq!(
        after.generation, before.generation,
        "random inserts over a larger tree should be logged, not checkpointed"
    );
    assert!(
        after.wal_bytes > 16 << 20,
        "the transaction should be in the WAL ({} bytes)",
        after.wal_bytes
    );

    // Both survive a reopen (the logged one by replay).
    drop(store);
    let store = Store::open_with(dir.path().join("s"), opts()).expect("reopen");
    let r = store.read().expect("read");
    assert_eq!(
        r.get(b"sorted:00000000000119999").expect("get").as_deref(),
        Some(&VALUE[..])
    );
    assert_eq!(
        r.get(&random_key(1_119_999)).expect("get").as_deref(),
        Some(&VALUE[..])
    );
    assert_eq!(
        store.stats().expect("stats").keys,
        120_000 + 300_000 + 120_000
    );
}
