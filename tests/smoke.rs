//! Basic end-to-end behaviour of the engine through its public API: put/get/delete,
//! scans in both directions with bounds, checkpoint, reopen with and without WAL
//! replay, large values out of line, and a clean `verify` at every step.

use cambium::{Options, Store};
use std::collections::BTreeMap;
use std::ops::Bound;

fn opts() -> Options {
    Options {
        background_checkpoints: false,
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{:08}", (i.wrapping_mul(2_654_435_761)) % 1_000_000).into_bytes()
}

#[test]
fn put_get_scan_checkpoint_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = Store::create_with(&path, opts()).unwrap();
    let mut model = BTreeMap::new();
    let mut txn = store.begin_write().unwrap();
    for i in 0..20_000u32 {
        let v = vec![(i % 251) as u8; (i % 200) as usize];
        txn.put(&key(i), &v).unwrap();
        model.insert(key(i), v);
    }
    txn.commit().unwrap();
    let r = store.read().unwrap();
    for (k, v) in &model {
        assert_eq!(r.get(k).unwrap().as_ref(), Some(v));
    }
    let all: Vec<_> = r.iter().unwrap().map(Result::unwrap).collect();
    assert_eq!(
        all,
        model
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    );
    let rev: Vec<_> = r.iter().unwrap().rev().map(|kv| kv.unwrap().0).collect();
    assert_eq!(rev, model.keys().rev().cloned().collect::<Vec<_>>());
    let lo = key(5);
    let hi = key(77);
    let (lo, hi) = if lo < hi { (lo, hi) } else { (hi, lo) };
    let got: Vec<_> = r
        .range((Bound::Excluded(&lo[..]), Bound::Included(&hi[..])))
        .unwrap()
        .map(|kv| kv.unwrap().0)
        .collect();
    let want: Vec<_> = model
        .range((Bound::Excluded(lo.clone()), Bound::Included(hi.clone())))
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(got, want);
    assert_eq!(r.count(..).unwrap(), model.len() as u64);

    drop(r);
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.keys, model.len() as u64);

    // Deletes of half the keys, then more writes that stay in the WAL only.
    let mut txn = store.begin_write().unwrap();
    for i in (0..20_000u32).step_by(2) {
        assert!(txn.delete(&key(i)).unwrap());
        model.remove(&key(i));
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    let big = vec![7u8; 100_000];
    store.put(b"big", &big).unwrap();
    model.insert(b"big".to_vec(), big);
    store.put(b"small", b"v").unwrap();
    model.insert(b"small".to_vec(), b"v".to_vec());
    drop(store);

    // Reopen (the drop checkpointed); then crash-free reopen with WAL only.
    let store = Store::open_with(
        &path,
        Options {
            checkpoint_on_close: false,
            ..opts()
        },
    )
    .unwrap();
    let r = store.read().unwrap();
    assert_eq!(r.count(..).unwrap(), model.len() as u64);
    for (k, v) in &model {
        assert_eq!(r.get(k).unwrap().as_ref(), Some(v));
    }
    store.put(b"wal-only", b"x").unwrap();
    model.insert(b"wal-only".to_vec(), b"x".to_vec());
    drop(r);
    drop(store);
    let store = Store::open_with(&path, opts()).unwrap();
    assert_eq!(store.get(b"wal-only").unwrap(), Some(b"x".to_vec()));
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.wal_records, 1);
    store.checkpoint().unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.keys, model.len() as u64);
}

/// The size limits the issue names: keys of 2 KiB (at least 1 KiB asked), values of
/// 64 MiB stored once in their own extent, both surviving a reopen; one byte more is a
/// clear error that leaves the store intact.
#[test]
fn largest_keys_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = Store::create_with(&path, opts()).unwrap();
    let big_key = vec![b'k'; cambium::MAX_KEY_LEN];
    let big_value: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut txn = store.begin_write().unwrap();
    txn.put(&big_key, b"long key").unwrap();
    txn.put(b"video", &big_value).unwrap();
    let too_long = vec![b'k'; cambium::MAX_KEY_LEN + 1];
    assert!(matches!(
        txn.put(&too_long, b"x"),
        Err(cambium::Error::KeyTooLarge { .. })
    ));
    assert!(matches!(
        txn.put(b"", b"x"),
        Err(cambium::Error::KeyTooLarge { .. })
    ));
    txn.commit().unwrap();
    let wal_bytes = store.stats().unwrap().wal_bytes;
    assert!(
        wal_bytes < 1 << 20,
        "the 64 MiB value went through the WAL ({wal_bytes} bytes)"
    );
    drop(store);
    let store = Store::open_with(&path, opts()).unwrap();
    assert_eq!(store.get(&big_key).unwrap(), Some(b"long key".to_vec()));
    assert!(store.get(b"video").unwrap() == Some(big_value));
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.extents, 1);
}

/// Keys whose byte order is the order of `i`.
fn ordered_key(i: u32) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

/// Leaves filled by a load of `n` keys in the given order, as a fraction of the
/// node size bound: the entries' encoded bytes over the leaves' capacity.
fn leaf_fill(order: &[u32]) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create_with(dir.path(), opts()).unwrap();
    let mut txn = store.begin_write().unwrap();
    for &i in order {
        txn.put(&ordered_key(i), &[7u8; 100]).unwrap();
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    let stats = store.stats().unwrap();
    assert_eq!(stats.keys, order.len() as u64);
    // An entry: key length (2), value tag (1), the key, value length (4), the value.
    let entry = (2 + 1 + ordered_key(0).len() + 4 + 100) as f64;
    let node_max = 8192.0;
    order.len() as f64 * entry / (stats.leaf_nodes as f64 * node_max)
}

/// The append fast path: keys arriving in ascending order split the right edge of
/// the tree before its last entry, so the leaves they leave behind are full; the
/// same keys in random order leave them about two-thirds full, as B-trees do.
#[test]
fn sorted_loads_fill_their_leaves() {
    let n = 40_000u32;
    let sorted: Vec<u32> = (0..n).collect();
    let mut shuffled = sorted.clone();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..shuffled.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        shuffled.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let sorted_fill = leaf_fill(&sorted);
    let random_fill = leaf_fill(&shuffled);
    assert!(
        sorted_fill > 0.95,
        "sorted load fills leaves to {sorted_fill:.2}"
    );
    assert!(
        random_fill < 0.85,
        "random load fills leaves to {random_fill:.2}"
    );
}

/// A delete of a key that is not there changes nothing: no node is copied, whether the
/// path to where it would be is written (it is looked up first) or already this
/// transaction's own (the descent goes ahead, and finds nothing). And deletes of keys
/// that are there, mixed with absent ones in one transaction, leave exactly the model.
#[test]
fn deleting_absent_keys_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create_with(dir.path().join("db"), opts()).unwrap();
    let present = |i: u32| format!("k{:06}", 2 * i).into_bytes();
    let absent = |i: u32| format!("k{:06}", 2 * i + 1).into_bytes();
    let mut model = BTreeMap::new();
    let mut txn = store.begin_write().unwrap();
    for i in 0..30_000u32 {
        txn.put(&present(i), &[7; 100]).unwrap();
        model.insert(present(i), vec![7; 100]);
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    assert_eq!(store.stats().unwrap().dirty_nodes, 0);

    // What one put at the right edge makes dirty: its path.
    let mut txn = store.begin_write().unwrap();
    txn.put(b"z1", b"v").unwrap();
    txn.commit().unwrap();
    let path = store.stats().unwrap().dirty_nodes;
    assert!(path >= 2, "a multi-level tree");
    store.checkpoint().unwrap();
    // The same put with absent deletes all over the tree: still only its path.
    let mut txn = store.begin_write().unwrap();
    txn.put(b"z2", b"v").unwrap();
    for i in (0..30_000u32).step_by(7) {
        assert!(!txn.delete(&absent(i)).unwrap());
    }
    txn.commit().unwrap();
    assert_eq!(
        store.stats().unwrap().dirty_nodes,
        path,
        "deleting absent keys copied nodes"
    );
    model.insert(b"z1".to_vec(), b"v".to_vec());
    model.insert(b"z2".to_vec(), b"v".to_vec());

    // Present and absent keys in one transaction: the absent ones then run down paths
    // the present ones made this transaction's own, thin nodes included.
    let mut txn = store.begin_write().unwrap();
    for i in 0..30_000u32 {
        if i % 3 != 0 {
            assert!(txn.delete(&present(i)).unwrap());
            model.remove(&present(i));
        }
        assert!(!txn.delete(&absent(i)).unwrap());
    }
    txn.commit().unwrap();
    let r = store.read().unwrap();
    let all: BTreeMap<Vec<u8>, Vec<u8>> = r.iter().unwrap().map(Result::unwrap).collect();
    assert_eq!(all, model);
    assert!(store.verify().unwrap().problems.is_empty());
}

/// The segment files of the store at `path`.
fn segment_files(path: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("seg-"))
        .collect();
    names.sort();
    names
}

/// `put_many` with only small (inline) values writes no extent, so it opens no data
/// segment; large values open one, and read back.
#[test]
fn put_many_opens_a_data_segment_only_for_large_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = Store::create_with(&path, opts()).unwrap();
    let before = segment_files(&path);
    let mut txn = store.begin_write().unwrap();
    txn.put_many(&[(b"a", b"small"), (b"b", b"values")])
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(segment_files(&path), before, "no segment for inline values");
    let big = vec![7u8; 5000];
    let mut txn = store.begin_write().unwrap();
    txn.put_many(&[(b"c", &big[..]), (b"d", b"inline")])
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(
        segment_files(&path).len(),
        before.len() + 1,
        "one data segment"
    );
    let read = store.read().unwrap();
    assert_eq!(read.get(b"c").unwrap().as_deref(), Some(&big[..]));
    assert_eq!(read.get(b"a").unwrap().as_deref(), Some(&b"small"[..]));
    drop(read);
    assert!(store.verify().unwrap().is_clean());
}

/// `create` makes the missing directories of its path (syncing each one's parent, so
/// a power loss cannot lose the store's directory entry).
#[test]
fn create_makes_missing_parent_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a").join("b").join("db");
    let store = Store::create_with(&path, opts()).unwrap();
    store.put(b"k", b"v").unwrap();
    store.close().unwrap();
    let store = Store::open_with(&path, opts()).unwrap();
    assert_eq!(store.get(b"k").unwrap(), Some(b"v".to_vec()));
}
