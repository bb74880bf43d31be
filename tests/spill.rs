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
