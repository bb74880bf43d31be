//! A transaction bigger than `Options::txn_dirty_bytes` writes its dirty nodes out
//! before it commits (a spill). These tests drive spills with a tiny budget and check
//! what must hold around them: the committed data equals a model, a snapshot taken
//! before keeps its own data (shared nodes are copied, never spilled over), an
//! aborted spilling transaction leaves no trace but dead bytes, and `verify` (tree,
//! reference counts, live bytes, back references) is clean after each step and after
//! a reopen.

use cambium::{Options, Store};
use std::collections::BTreeMap;

fn opts() -> Options {
    Options {
        background_checkpoints: false,
        txn_dirty_bytes: 64 << 10,
        ..Default::default()
    }
}

/// A deterministic key order that is neither sorted nor clustered.
fn key(i: u64) -> Vec<u8> {
    format!("k{:012}", i.wrapping_mul(2_654_435_761) % 1_000_003).into_bytes()
}

fn check(store: &Store, model: &BTreeMap<Vec<u8>, Vec<u8>>, at: &str) {
    let got: Vec<(Vec<u8>, Vec<u8>)> = store
        .read_at(at)
        .unwrap()
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(got.len(), want.len(), "key count of {at}");
    assert!(got == want, "contents of {at}");
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn spilled_transactions_commit_abort_and_reopen_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create_with(dir.path(), opts()).unwrap();
    let mut model = BTreeMap::new();
    // A first large transaction (spills many times), with out-of-line values too.
    let mut txn = store.begin_write().unwrap();
    for i in 0..20_000u64 {
        let v = if i % 97 == 0 {
            vec![b'x'; 3000]
        } else {
            format!("v{i}").into_bytes()
        };
        txn.put(&key(i), &v).unwrap();
        model.insert(key(i), v);
    }
    txn.commit().unwrap();
    check(&store, &model, "main");
    store.checkpoint().unwrap();
    store.snapshot("main", "before").unwrap();
    let before = model.clone();

    // Overwrites, deletes and inserts over a tree shared with the snapshot.
    let mut txn = store.begin_write().unwrap();
    for i in 0..30_000u64 {
        let k = key(i);
        if i % 3 == 0 {
            txn.delete(&k).unwrap();
            model.remove(&k);
        } else {
            let v = format!("w{i}").into_bytes();
            txn.put(&k, &v).unwrap();
            model.insert(k, v);
        }
    }
    txn.commit().unwrap();
    check(&store, &model, "main");
    check(&store, &before, "before");

    // An aborted spilling transaction changes nothing.
    let mut txn = store.begin_write().unwrap();
    for i in 0..20_000u64 {
        txn.put(&key(i + 50_000), b"aborted").unwrap();
    }
    drop(txn);
    check(&store, &model, "main");
    store.checkpoint().unwrap();
    check(&store, &model, "main");
    store.close().unwrap();

    let store = Store::open_with(dir.path(), opts()).unwrap();
    check(&store, &model, "main");
    check(&store, &before, "before");
    store.drop_version("before").unwrap();
    store.checkpoint().unwrap();
    check(&store, &model, "main");
}

/// The sorted runs a large transaction's out-of-order edits go to (`txn-*.run`).
fn run_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name().into_string().unwrap();
            name.starts_with("txn-") && name.ends_with(".run")
        })
        .count()
}

/// A large transaction of random puts (inline and out of line), deletes and reads,
/// against a model: past its budget it defers its edits to sorted runs, and reads
/// inside it (`get`, `keys_in`), its deletes' answers and what it commits must all
/// be what the model says; an abort leaves nothing; a snapshot keeps its data.
#[test]
fn out_of_order_edits_are_deferred_read_back_and_committed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create_with(dir.path(), opts()).unwrap();
    let mut model = BTreeMap::new();
    let mut txn = store.begin_write().unwrap();
    for i in 0..5_000u64 {
        let v = format!("base{i}").into_bytes();
        txn.put(&key(i), &v).unwrap();
        model.insert(key(i), v);
    }
    txn.commit().unwrap();
    store.snapshot("main", "base").unwrap();
    let base = model.clone();

    let mut seed = 7u64;
    let mut rand = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for commit in [true, false] {
        let before = model.clone();
        let mut txn = store.begin_write().unwrap();
        let mut deferred_seen = false;
        for op in 0..40_000u64 {
            let k = key(rand(20_000));
            match rand(10) {
                0..=5 => {
                    let len = if rand(40) == 0 {
                        1_500 + rand(2_000)
                    } else {
                        10 + rand(190)
                    };
                    let v = vec![b'a' + (op % 26) as u8; len as usize];
                    txn.put(&k, &v).unwrap();
                    model.insert(k, v);
                }
                6..=7 => {
                    let existed = txn.delete(&k).unwrap();
                    assert_eq!(
                        existed,
                        model.remove(&k).is_some(),
                        "delete {k:?} at op {op}"
                    );
                }
                _ => assert_eq!(
                    txn.get(&k).unwrap(),
                    model.get(&k).cloned(),
                    "get {k:?} at op {op}"
                ),
            }
            if op % 997 == 0 {
                let (a, b) = (key(rand(20_000)), key(rand(20_000)));
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                let limit = 1 + rand(300) as usize;
                let want: Vec<Vec<u8>> = model
                    .range(lo.clone()..hi.clone())
                    .map(|(k, _)| k.clone())
                    .take(limit)
                    .collect();
                assert_eq!(
                    txn.keys_in(&lo, &hi, limit).unwrap(),
                    want,
                    "keys_in at op {op}"
                );
            }
            deferred_seen |= run_files(dir.path()) > 0;
        }
        assert!(
            deferred_seen,
            "a 64 KiB budget must defer 40,000 random edits to runs"
        );
        if commit {
            txn.commit().unwrap();
        } else {
            drop(txn);
            model = before;
        }
        assert_eq!(run_files(dir.path()), 0, "runs outlive their transaction");
        check(&store, &model, "main");
        check(&store, &base, "base");
    }
    store.close().unwrap();
    let store = Store::open_with(dir.path(), opts()).unwrap();
    check(&store, &model, "main");
    check(&store, &base, "base");
}

/// Run files a crashed writer left are removed when the store is next opened.
#[test]
fn a_crashed_transactions_runs_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    Store::create_with(dir.path(), opts())
        .unwrap()
        .close()
        .unwrap();
    std::fs::write(dir.path().join("txn-00000003.run"), b"left by a crash").unwrap();
    let store = Store::open_with(dir.path(), opts()).unwrap();
    assert_eq!(run_files(dir.path()), 0);
    assert!(store.verify().unwrap().is_clean());
}
