//! A large transaction commits by checkpoint, with no WAL record of its own: its LSN
//! is marked with a `CheckpointCommit` record opening the WAL generation the
//! checkpoint's freeze started, which recovery from an older superblock refuses (it
//! could not rebuild the transaction). So that record must never be durable before
//! the superblock that holds the transaction: it is appended only once that
//! superblock is durable (any sync, which takes no writer lock, may write the log's
//! buffer while the checkpoint runs). A crash
//! (power loss, or a kill that keeps every write) at I/O operations spread over that
//! commit must leave a store that opens, holding all of the transaction (if it was
//! acknowledged) or none of it.

mod common;

use cambium::io::sim::SimVfs;
use cambium::Options;
use common::{open_sim, sim_options, SIM_PATH};

fn options(vfs: &SimVfs) -> Options {
    Options {
        txn_dirty_bytes: 16 << 10,
        ..sim_options(vfs)
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("k{:08}", i.wrapping_mul(2_654_435_761) % 1_000_003).into_bytes()
}

#[test]
fn a_crash_inside_a_large_commit_leaves_a_store_that_opens() {
    // The base state: one small durable commit.
    let vfs = SimVfs::new();
    {
        let store = cambium::Store::create_with(SIM_PATH, options(&vfs)).unwrap();
        store.put(b"before", b"1").unwrap();
        store.close().unwrap();
    }
    let large = |store: &cambium::Store| -> cambium::Result<()> {
        let mut txn = store.begin_write()?;
        for i in 0..2_000 {
            txn.put(&key(i), format!("value {i}").as_bytes())?;
        }
        txn.commit()
    };
    // How many I/O operations the large commit takes.
    let ops = {
        let fork = vfs.fork();
        let store = cambium::Store::open_with(SIM_PATH, options(&fork)).unwrap();
        let before = fork.op_count();
        large(&store).unwrap();
        fork.op_count() - before
    };
    assert!(ops > 10, "{ops} operations");
    let mut checked = 0;
    // About 40 points spread over the commit, the last ones included.
    let stride = (ops / 40).max(1);
    for fail_at in (0..ops)
        .step_by(stride as usize)
        .chain(ops.saturating_sub(3)..ops)
    {
        for keep_all in [true, false] {
            let fork = vfs.fork();
            let store = cambium::Store::open_with(SIM_PATH, options(&fork)).unwrap();
            fork.set_fail_after(Some(fail_at));
            let committed = large(&store).is_ok();
            drop(store);
            let after = if keep_all {
                fork.crash_keep_all()
            } else {
                fork.crash_drop_all()
            };
            let store = open_sim(&after).unwrap_or_else(|e| {
                panic!("crash at operation {fail_at} of {ops} (keep all: {keep_all}): {e}")
            });
            let read = store.read().unwrap();
            assert_eq!(read.get(b"before").unwrap().as_deref(), Some(&b"1"[..]));
            let first = read.get(&key(0)).unwrap();
            let last = read.get(&key(1_999)).unwrap();
            assert_eq!(first.is_some(), last.is_some(), "all or nothing");
            if committed {
                assert!(first.is_some(), "an acknowledged commit survives");
            }
            checked += 1;
        }
    }
    eprintln!("{checked} crash points over {ops} operations");
}

/// An I/O error anywhere in a large transaction (its spills, the sorted runs its
/// out-of-order edits go to, their merge, its checkpoint) fails it as a whole: the
/// store holds all of it (an error after its superblock was durable) or none of it,
/// and the next transaction commits.
#[test]
fn an_io_error_inside_a_large_transaction_fails_it_whole() {
    use std::collections::BTreeMap;
    type Model = BTreeMap<Vec<u8>, Vec<u8>>;
    let vfs = SimVfs::new();
    {
        let store = cambium::Store::create_with(SIM_PATH, options(&vfs)).unwrap();
        store.put(b"before", b"1").unwrap();
        store.close().unwrap();
    }
    let base: Model = [(b"before".to_vec(), b"1".to_vec())].into();
    // The transaction, applied to the store and to a model of it.
    let large = |store: &cambium::Store, model: &mut Model, tag: &str| -> cambium::Result<()> {
        let mut txn = store.begin_write()?;
        for i in 0..3_000 {
            let v = format!("{tag} {i}").into_bytes();
            txn.put(&key(i), &v)?;
            model.insert(key(i), v);
            if i % 7 == 0 {
                txn.delete(&key(i / 2))?;
                model.remove(&key(i / 2));
            }
        }
        txn.commit()
    };
    let contents = |store: &cambium::Store| -> Model {
        let read = store.read().unwrap();
        read.iter().unwrap().map(Result::unwrap).collect()
    };
    let ops = {
        let fork = vfs.fork();
        let store = cambium::Store::open_with(SIM_PATH, options(&fork)).unwrap();
        let before = fork.op_count();
        large(&store, &mut base.clone(), "probe").unwrap();
        fork.op_count() - before
    };
    let mut failed = 0;
    for fail_at in (0..ops).step_by((ops / 30).max(1) as usize) {
        let fork = vfs.fork();
        let store = cambium::Store::open_with(SIM_PATH, options(&fork)).unwrap();
        fork.set_fail_once_after(Some(fail_at));
        let mut all = base.clone();
        if large(&store, &mut all, "failed").is_ok() {
            continue;
        }
        failed += 1;
        // A store whose checkpoint failed refuses writes (poisoned) until reopened.
        let store = if store.put(b"probe", b"").is_ok() && store.delete(b"probe").is_ok() {
            store
        } else {
            drop(store);
            open_sim(&fork).unwrap()
        };
        let got = contents(&store);
        assert!(
            got == base || got == all,
            "failed at {fail_at} of {ops}: part of it is there"
        );
        let mut model = got;
        large(&store, &mut model, "retry").unwrap();
        assert!(contents(&store) == model, "failed at {fail_at}: the retry");
        assert!(store.verify().unwrap().is_clean(), "failed at {fail_at}");
    }
    assert!(
        failed > 10,
        "{failed} of the injected errors failed the transaction"
    );
}

/// A `Store::sync` (an NBD flush, another thread's) while a large transaction's
/// checkpoint is writing, then a power loss before its superblock is durable: the
/// store opens, without the transaction. (The checkpoint-commit marker was once put
/// in the log's buffer at the freeze, where that sync made it durable ahead of its
/// superblock, and every later open refused the store.)
#[test]
fn a_sync_during_a_large_commit_cannot_make_its_marker_durable_early() {
    let vfs = SimVfs::new();
    let store = std::sync::Arc::new(cambium::Store::create_with(SIM_PATH, options(&vfs)).unwrap());
    store.put(b"before", b"1").unwrap();
    let (syncer, faulty) = (store.clone(), vfs.clone());
    let synced = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let saw = synced.clone();
    vfs.before_next_write_to("superblock", move || {
        // Inside the checkpoint, its nodes and log tail written: a flush from
        // elsewhere, then the power goes before the superblock is written.
        saw.store(syncer.sync().is_ok(), std::sync::atomic::Ordering::SeqCst);
        faulty.set_fail_after(Some(0));
    });
    let mut txn = store.begin_write().unwrap();
    for i in 0..2_000 {
        txn.put(&key(i), format!("value {i}").as_bytes()).unwrap();
    }
    assert!(txn.commit().is_err(), "its superblock write failed");
    assert!(
        synced.load(std::sync::atomic::Ordering::SeqCst),
        "the sync ran inside the checkpoint and succeeded"
    );
    let after = vfs.crash_drop_all();
    drop(store);
    let store = open_sim(&after).unwrap_or_else(|e| panic!("the store must open: {e}"));
    let read = store.read().unwrap();
    assert_eq!(read.get(b"before").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(
        read.get(&key(0)).unwrap(),
        None,
        "not acknowledged, not there"
    );
    assert!(store.verify().unwrap().is_clean());
}
