//! Crash-recovery tests on the simulated file system.
//!
//! Method: a seeded random workload (write transactions with Immediate and Deferred
//! durability, large values that go to extents, aborted transactions, one-shot
//! puts, checkpoints, close + reopen) runs on a store over [`SimVfs`]. A power loss
//! is simulated at a chosen point: the workload is first run once to count its
//! mutating I/O operations, then re-run with a persistent I/O fault armed at a
//! random operation index (freezing the disk image exactly there, in the middle of
//! a commit, a checkpoint or a close), after which `SimVfs::crash(seed)` produces
//! the post-power-loss image (unsynced writes kept, dropped or torn per the seed).
//! The old store is dropped (its errors ignored) and the store is reopened from the
//! image. Then more work is done and a second crash/reopen is checked.
//!
//! Invariants checked after every crash:
//! - the store opens;
//! - its state equals the model after exactly `k` commits, for some `k` at least
//!   the index of the last commit known durable (an Immediate commit that returned
//!   Ok, or any commit before a checkpoint/close that returned Ok) and at most the
//!   number of commits attempted (a commit that failed may or may not be there):
//!   nothing acknowledged is lost, and deferred commits survive atomically and in
//!   order, as a prefix;
//! - `verify()` is clean;
//! - the recovered store accepts new writes, checkpoints, and survives a second
//!   crash with the same guarantees.
//!
//! Tests: `random_crash_points` (many seeds, two crashes each),
//! `crash_at_every_operation` (every I/O operation of a small workload in turn),
//! `crash_during_checkpoint` (every I/O operation of one large checkpoint in turn).
//! Replay one seed with `CAMBIUM_SEED=N`; scale with `CAMBIUM_CRASH_CASES=N`;
//! `CAMBIUM_TRACE=1` prints every workload step.

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Durability, Store};
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// A store built up to a checkpoint attempt: the file system, the store, the
/// history, the checkpoint's outcome and its number of I/O operations.
type Built = (SimVfs, Store, History, Result<(), String>, u64);

/// Crash points checked in this process (reported at the end of each test).
static CRASH_POINTS: AtomicU64 = AtomicU64::new(0);

/// The commit history of one run.
struct History {
    /// `states[i]` is the model after `i` commits.
    states: Vec<Model>,
    /// Index into `states` of the newest state known durable.
    durable: usize,
}

impl History {
    fn new(base: Model) -> Self {
        History {
            states: vec![base],
            durable: 0,
        }
    }
    fn current(&self) -> &Model {
        self.states.last().unwrap()
    }
    fn all_durable(&mut self) {
        self.durable = self.states.len() - 1;
    }
    /// Checks a recovered state; returns the matching commit index.
    fn check(&self, got: &Model) -> Result<usize, String> {
        for k in (self.durable..self.states.len()).rev() {
            if &self.states[k] == got {
                return Ok(k);
            }
        }
        let older = (0..self.durable).rev().find(|&k| &self.states[k] == got);
        Err(format!(
            "recovered state matches no allowed commit prefix (allowed {}..={}, {} keys recovered; {}); vs last durable: {}; vs newest: {}",
            self.durable,
            self.states.len() - 1,
            got.len(),
            match older {
                Some(k) => format!("it equals the state after commit {k}: ACKNOWLEDGED COMMITS LOST"),
                None => "it equals no state of the history".into(),
            },
            diff(got, &self.states[self.durable]).unwrap_or_else(|| "equal".into()),
            diff(got, self.current()).unwrap_or_else(|| "equal".into()),
        ))
    }
}

/// Why a workload stopped early.
enum Stopped {
    /// Ran to the end; the store is open.
    Done(Store),
    /// An operation failed (the injected fault); the store, if still open, is returned.
    Failed(Option<Store>, String),
}

/// One write transaction; a failed commit's state is recorded as possible.
fn txn_step(store: &Store, rng: &mut Rng, hist: &mut History) -> Result<(), String> {
    let durability = if rng.chance(2, 5) {
        Durability::Deferred
    } else {
        Durability::Immediate
    };
    let mut pending = hist.current().clone();
    let mut txn = store
        .begin_write()
        .map_err(|e| format!("begin_write: {e}"))?;
    txn.set_durability(durability);
    for _ in 0..rng.usize(1, 6) {
        let key = gen_key(rng, &pending);
        if rng.chance(3, 4) {
            let value = gen_value(rng);
            pending.insert(key.clone(), value.clone());
            txn.put(&key, &value).map_err(|e| format!("txn.put: {e}"))?;
        } else {
            pending.remove(&key);
            txn.delete(&key).map_err(|e| format!("txn.delete: {e}"))?;
        }
    }
    let r = txn.commit();
    if std::env::var("CAMBIUM_TRACE").is_ok() {
        eprintln!(
            "  commit {} {durability:?} (no-op: {}) -> {:?}",
            hist.states.len(),
            &pending == hist.current(),
            r.as_ref().map_err(|e| e.to_string())
        );
    }
    hist.states.push(pending);
    match r {
        Ok(()) if durability == Durability::Immediate => hist.all_durable(),
        Ok(()) => {}
        Err(e) => return Err(format!("commit: {e}")),
    }
    Ok(())
}

/// A transaction that is aborted or dropped.
fn aborted_step(store: &Store, rng: &mut Rng, hist: &History) -> Result<(), String> {
    let mut txn = store
        .begin_write()
        .map_err(|e| format!("begin_write: {e}"))?;
    let key = gen_key(rng, hist.current());
    let _ = txn.put(&key, b"aborted");
    if rng.chance(1, 2) {
        txn.abort();
    } else {
        drop(txn);
    }
    Ok(())
}

/// Runs `steps` random steps. Every error stops the run (faults are injected on
/// purpose; the state of a failed commit is recorded as possible).
fn workload(
    vfs: &SimVfs,
    mut store: Store,
    rng: &mut Rng,
    hist: &mut History,
    steps: usize,
) -> Stopped {
    let trace = std::env::var("CAMBIUM_TRACE").is_ok();
    for step in 0..steps {
        let roll = rng.below(100);
        if trace {
            eprintln!(
                "step {step}: roll {roll}, ops so far {}, commits {}, durable {}",
                vfs.op_count(),
                hist.states.len() - 1,
                hist.durable
            );
        }
        match roll {
            0..=64 => {
                if let Err(msg) = txn_step(&store, rng, hist) {
                    return Stopped::Failed(Some(store), format!("step {step}: {msg}"));
                }
            }
            65..=71 => {
                if let Err(msg) = aborted_step(&store, rng, hist) {
                    return Stopped::Failed(Some(store), format!("step {step}: {msg}"));
                }
            }
            72..=79 => {
                let key = gen_key(rng, hist.current());
                let value = gen_value(rng);
                let mut next = hist.current().clone();
                next.insert(key.clone(), value.clone());
                hist.states.push(next);
                match store.put(&key, &value) {
                    Ok(()) => hist.all_durable(),
                    Err(e) => {
                        return Stopped::Failed(Some(store), format!("step {step}: store.put: {e}"))
                    }
                }
            }
            80..=91 => match store.checkpoint() {
                Ok(()) => hist.all_durable(),
                Err(e) => {
                    return Stopped::Failed(Some(store), format!("step {step}: checkpoint: {e}"))
                }
            },
            _ => {
                let closed = rng.chance(1, 2);
                if closed {
                    match store.close() {
                        Ok(()) => hist.all_durable(),
                        Err(e) => return Stopped::Failed(None, format!("step {step}: close: {e}")),
                    }
                } else {
                    // Dropped without close: like a process exit, deferred commits
                    // not yet durable may be lost (as a suffix).
                    drop(store);
                }
                store = match open_sim(vfs) {
                    Ok(s) => s,
                    Err(e) => return Stopped::Failed(None, format!("step {step}: reopen: {e}")),
                };
                match store.read().and_then(|r| dump(&r)) {
                    Ok(got) if closed && &got != hist.current() => {
                        return Stopped::Failed(
                            Some(store),
                            format!(
                                "BUG step {step}: close + reopen without a crash lost data: {}",
                                diff(&got, hist.current()).unwrap()
                            ),
                        )
                    }
                    Ok(got) => match hist.check(&got) {
                        Ok(k) => hist.states.truncate(k + 1),
                        Err(e) => {
                            return Stopped::Failed(
                                Some(store),
                                format!("BUG step {step}: drop + reopen: {e}"),
                            )
                        }
                    },
                    Err(e) => {
                        return Stopped::Failed(
                            Some(store),
                            format!("step {step}: read after reopen: {e}"),
                        )
                    }
                }
                // What a reopen recovers is not necessarily durable (it may come from
                // written but unsynced WAL bytes), so `durable` is left as it was.
            }
        }
    }
    Stopped::Done(store)
}

/// Crashes `vfs` with `seed`, drops the old store, reopens and checks against
/// `hist`. Returns the recovered store and its state.
fn crash_and_check(
    vfs: &SimVfs,
    old: Option<Store>,
    seed: u64,
    hist: &History,
    label: &str,
) -> Result<(SimVfs, Store, Model), String> {
    let image = vfs.crash(seed);
    drop(old); // errors from the dead file system are ignored (must not panic)
    CRASH_POINTS.fetch_add(1, Ordering::Relaxed);
    let store =
        open_sim(&image).map_err(|e| format!("{label}: open after crash failed: {e} ({e:?})"))?;
    let got = ctx(
        store.read().and_then(|r| dump(&r)),
        format!("{label}: read after crash"),
    )?;
    hist.check(&got).map_err(|e| format!("{label}: {e}"))?;
    verify_clean(&store, &format!("{label}: after crash recovery"))?;
    Ok((image, store, got))
}

/// After a first recovery: more work, a checkpoint maybe, then a second crash.
fn second_round(
    image: SimVfs,
    store: Store,
    state: Model,
    rng: &mut Rng,
    seed: u64,
) -> Result<(), String> {
    let mut hist = History::new(state);
    // The recovered store must accept writes.
    let probe = b"\xffafter-crash".to_vec();
    let mut next = hist.current().clone();
    next.insert(probe.clone(), b"1".to_vec());
    hist.states.push(next);
    ctx(store.put(&probe, b"1"), "second round: put after recovery")?;
    hist.all_durable();
    let steps = rng.usize(1, 12);
    let store = match workload(&image, store, rng, &mut hist, steps) {
        Stopped::Done(s) => s,
        // No fault is armed in this round: any failure is an engine error.
        Stopped::Failed(_, msg) => return Err(format!("second round (no faults armed): {msg}")),
    };
    let (_image2, store2, _) =
        crash_and_check(&image, Some(store), seed ^ 0x2C2C, &hist, "second crash")?;
    drop(store2);
    Ok(())
}

fn run_once(
    seed: u64,
    steps: usize,
    fail_at: Option<u64>,
) -> Result<(SimVfs, Option<Store>, History, Rng, u64), String> {
    let mut rng = Rng::new(seed);
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let start = vfs.op_count();
    vfs.set_fail_after(fail_at);
    let mut hist = History::new(Model::new());
    let store = match workload(&vfs, store, &mut rng, &mut hist, steps) {
        Stopped::Done(s) => Some(s),
        Stopped::Failed(s, msg) => {
            if fail_at.is_none() || msg.contains("BUG") {
                return Err(format!("workload failed without an injected fault: {msg}"));
            }
            s
        }
    };
    let ops = vfs.op_count() - start;
    Ok((vfs, store, hist, rng, ops))
}

/// Many seeds; each picks a random crash point over its whole workload.
#[test]
fn random_crash_points() {
    CRASH_POINTS.store(0, Ordering::Relaxed);
    run_seeds("random_crash_points", "crash", 400, |seed| {
        let mut rng = Rng::new(seed ^ 0xC7A5);
        let steps = rng.usize(3, 40);
        // Dry run: count the workload's mutating I/O operations.
        let (_, store, _, _, total_ops) = run_once(seed, steps, None)?;
        drop(store);
        // One seed in four crashes at the end of the workload (deferred commits
        // possibly pending); the others freeze the disk at a random operation.
        let fail_at = if rng.chance(1, 4) {
            None
        } else {
            Some(rng.below(total_ops.max(1)))
        };
        let (vfs, store, hist, mut wrng, _) = run_once(seed, steps, fail_at)?;
        let (image, store, state) = crash_and_check(
            &vfs,
            store,
            seed,
            &hist,
            &format!("first crash (fault at op {fail_at:?} of {total_ops})"),
        )?;
        second_round(image, store, state, &mut wrng, seed)
    });
    eprintln!(
        "random_crash_points: {} crash points checked",
        CRASH_POINTS.load(Ordering::Relaxed)
    );
}

/// For a few small workloads, a crash at every mutating I/O operation in turn
/// (capped at 150 evenly spaced points per workload).
#[test]
fn crash_at_every_operation() {
    run_seeds("crash_at_every_operation", "crash_every", 6, |seed| {
        let seed = seed + 10_000;
        let steps = 20;
        let (_, store, _, _, total_ops) = run_once(seed, steps, None)?;
        drop(store);
        let stride = (total_ops / 150).max(1);
        let mut k = 0;
        let mut points = 0;
        while k < total_ops {
            let (vfs, store, hist, mut wrng, _) = run_once(seed, steps, Some(k))?;
            let crash_seed = seed.wrapping_mul(1000).wrapping_add(k);
            let (image, store, state) = crash_and_check(
                &vfs,
                store,
                crash_seed,
                &hist,
                &format!("crash at op {k} of {total_ops}"),
            )?;
            if k % 10 == 0 {
                second_round(image, store, state, &mut wrng, crash_seed)
                    .map_err(|e| format!("op {k}: {e}"))?;
            }
            points += 1;
            k += stride;
        }
        eprintln!(
            "crash_at_every_operation seed {seed}: {points} crash points over {total_ops} ops"
        );
        Ok(())
    });
}

/// One large checkpoint (many dirty nodes, extents, deferred commits), crashed at
/// every one of its I/O operations in turn (capped at 200 points), each with
/// several crash seeds; then the store must recover, and a checkpoint after
/// recovery must succeed.
#[test]
fn crash_during_checkpoint() {
    run_seeds("crash_during_checkpoint", "crash_ckpt", 4, |seed| {
        let build = |fail_in_checkpoint: Option<u64>| -> Result<Built, String> {
            let mut rng = Rng::new(seed ^ 0xC4EC);
            let vfs = SimVfs::new();
            let store = create_sim(&vfs);
            let mut hist = History::new(Model::new());
            // A checkpointed base, then many more commits, some deferred.
            for round in 0..2 {
                for _ in 0..40 {
                    let durability = if rng.chance(1, 3) {
                        Durability::Deferred
                    } else {
                        Durability::Immediate
                    };
                    let mut next = hist.current().clone();
                    let mut txn = ctx(store.begin_write(), "begin")?;
                    txn.set_durability(durability);
                    for _ in 0..rng.usize(5, 30) {
                        let key = gen_key(&mut rng, &next);
                        let value = gen_value(&mut rng);
                        ctx(txn.put(&key, &value), "put")?;
                        next.insert(key, value);
                    }
                    if rng.chance(1, 3) {
                        let key = gen_key(&mut rng, &next);
                        ctx(txn.delete(&key), "delete")?;
                        next.remove(&key);
                    }
                    ctx(txn.commit(), "commit")?;
                    hist.states.push(next);
                    if durability == Durability::Immediate {
                        hist.all_durable();
                    }
                }
                if round == 0 {
                    ctx(store.checkpoint(), "base checkpoint")?;
                    hist.all_durable();
                }
            }
            let before = vfs.op_count();
            vfs.set_fail_after(fail_in_checkpoint);
            let r = store.checkpoint().map_err(|e| e.to_string());
            if r.is_ok() {
                hist.all_durable();
            }
            let ops = vfs.op_count() - before;
            Ok((vfs, store, hist, r, ops))
        };
        let (_, store, _, r, ckpt_ops) = build(None)?;
        r.map_err(|e| format!("checkpoint without faults failed: {e}"))?;
        drop(store);
        let stride = (ckpt_ops / 200).max(1);
        let mut k = 0;
        while k <= ckpt_ops {
            for crash_seed in 0..6 {
                let (vfs, store, hist, r, _) = build(Some(k))?;
                if k < ckpt_ops && r.is_ok() {
                    return Err(format!(
                        "checkpoint returned Ok although op {k} of its {ckpt_ops} failed"
                    ));
                }
                let label =
                    format!("crash at checkpoint op {k}/{ckpt_ops}, crash seed {crash_seed}");
                let (_image, store, _) = crash_and_check(
                    &vfs,
                    Some(store),
                    seed * 7919 + k * 3 + crash_seed,
                    &hist,
                    &label,
                )?;
                ctx(
                    store.checkpoint(),
                    format!("{label}: checkpoint after recovery"),
                )?;
                verify_clean(&store, &format!("{label}: after post-recovery checkpoint"))?;
            }
            k += stride;
        }
        eprintln!("crash_during_checkpoint seed {seed}: checkpoint of {ckpt_ops} ops crashed at every {stride}th op");
        Ok(())
    });
}

/// A commit whose WAL write reached the file but whose fsync failed (as after a
/// process kill between the two) is replayed by the next open, which shows it; new
/// commits are then acknowledged. After a power loss, the store must still open
/// and hold exactly what the reopened store showed plus the acknowledged commits:
/// recovery must make durable what it replays before later commits depend on it.
#[test]
fn replayed_unsynced_wal_survives_power_loss() {
    run_seeds(
        "replayed_unsynced_wal_survives_power_loss",
        "crash_replay",
        1,
        |_seed| {
            // Operations of one small commit, measured.
            let probe = SimVfs::new();
            let store = create_sim(&probe);
            ctx(store.put(b"a", b"1"), "put a")?;
            let before = probe.op_count();
            ctx(store.put(b"b", b"2"), "put b")?;
            let commit_ops = probe.op_count() - before;
            drop(store);
            for k in 0..commit_ops {
                let label = format!("fault at op {k} of {commit_ops} of a commit");
                let vfs = SimVfs::new();
                let store = create_sim(&vfs);
                ctx(store.put(b"a", b"1"), "put a")?;
                vfs.set_fail_once_after(Some(k));
                let failed = store.put(b"b", b"2").is_err();
                drop(store);
                let store = ctx(open_sim(&vfs), format!("{label}: reopen"))?;
                let mut seen = ctx(store.read().and_then(|r| dump(&r)), "read")?;
                if !failed && !seen.contains_key(&b"b"[..]) {
                    return Err(format!("{label}: acknowledged b missing after reopen"));
                }
                ctx(store.put(b"c", b"3"), format!("{label}: put c"))?;
                seen.insert(b"c".to_vec(), b"3".to_vec());
                let image = vfs.crash_drop_all();
                drop(store);
                let store = open_sim(&image).map_err(|e| {
                    format!(
                        "{label} (failed {failed}, b seen {}): open after power loss: {e} ({e:?})",
                        seen.contains_key(&b"b"[..])
                    )
                })?;
                let got = ctx(store.read().and_then(|r| dump(&r)), "read after power loss")?;
                if let Some(d) = diff(&got, &seen) {
                    return Err(format!(
                        "{label} (commit failed: {failed}): after power loss: {d}"
                    ));
                }
                verify_clean(&store, &label)?;
            }
            Ok(())
        },
    );
}

/// A group commit syncs its records and the value extents they name at the same
/// time; on the simulated file system the extents go second, so a power loss can
/// keep a record whose extent it drops. The commit was not acknowledged (its sync
/// failed): recovery must end the log before that record, not replay a value that
/// does not read back, and must erase the dropped records, so that the commits
/// logged after recovery (which reuse their LSNs) survive the next power loss.
/// Every operation of one large-value commit is made to fail in turn, then the
/// power is cut; the case the test is about is counted and must occur.
#[test]
fn a_record_whose_extent_was_lost_is_not_replayed() {
    // Past what a group commit logs in the WAL in place of syncing the data
    // segment (`LOG_VALUES_MAX`, 256 KiB): a value that small goes into the same
    // write as its record, and this case cannot arise.
    let big = vec![0xB1u8; 300_000];
    let marker = b"extent-marker-key";
    let probe = SimVfs::new();
    let store = create_sim(&probe);
    store.put(b"a", b"1").unwrap();
    let before = probe.op_count();
    store.put(marker, &big).unwrap();
    let commit_ops = probe.op_count() - before;
    drop(store);
    let mut record_without_extent = 0;
    for k in 0..commit_ops {
        let label = format!("fault at op {k} of {commit_ops}");
        let vfs = SimVfs::new();
        let store = create_sim(&vfs);
        store.put(b"a", b"1").unwrap();
        vfs.set_fail_after(Some(k));
        let acknowledged = store.put(marker, &big).is_ok();
        let image = vfs.crash_drop_all();
        drop(store);
        let logged = image
            .names()
            .iter()
            .filter(|n| n.starts_with("wal-"))
            .any(|n| {
                let bytes = image.read_file(n).unwrap();
                bytes.windows(marker.len()).any(|w| w == marker)
            });
        let store = open_sim(&image).unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
        let got = store
            .get(marker)
            .unwrap_or_else(|e| panic!("{label}: get: {e}"));
        match &got {
            Some(v) => assert_eq!(v, &big, "{label}: wrong value"),
            None => assert!(!acknowledged, "{label}: acknowledged value lost"),
        }
        if logged && got.is_none() {
            record_without_extent += 1;
        }
        verify_clean(&store, &label).unwrap();
        // Commits after recovery, then another power loss.
        store.put(b"c", b"3").unwrap();
        store.put(b"d", &big).unwrap();
        let image = image.crash_drop_all();
        drop(store);
        let store = open_sim(&image).unwrap_or_else(|e| panic!("{label}: second reopen: {e}"));
        assert_eq!(
            store.get(b"c").unwrap().as_deref(),
            Some(&b"3"[..]),
            "{label}"
        );
        assert_eq!(
            store.get(b"d").unwrap().as_deref(),
            Some(&big[..]),
            "{label}"
        );
        assert_eq!(
            store.get(marker).unwrap(),
            got,
            "{label}: the dropped value came back"
        );
        verify_clean(&store, &label).unwrap();
    }
    assert!(
        record_without_extent > 0,
        "no fault point left a durable record without its extent ({commit_ops} tried)"
    );
}

/// Deferred commits with no sync between them: once their records pass 1 MiB the log
/// writes them out (unsynced) instead of holding them all in memory, so some reach
/// the file before the extents they name are synced. After a crash the store holds
/// a prefix of the commits, in order, each whole, and verifies clean. A process kill
/// (nothing unsynced lost) keeps the records written out, which shows they were.
#[test]
fn records_written_out_between_syncs_recover_as_a_prefix() {
    const COMMITS: usize = 1600;
    let value = |i: usize| -> Vec<u8> {
        let len = if i.is_multiple_of(40) { 6000 } else { 900 };
        (0..len).map(|j| (i * 31 + j) as u8).collect()
    };
    let key = |i: usize| format!("k{i:05}").into_bytes();
    // The recovered commits: exactly keys 0..k, each with its value.
    let prefix = |store: &Store, label: &str| -> usize {
        let got = dump(&store.read().unwrap()).unwrap();
        let k = got.keys().filter(|k| k.starts_with(b"k")).count();
        assert_eq!(
            got.get(&b"base"[..]).map(Vec::as_slice),
            Some(&b"1"[..]),
            "{label}"
        );
        for i in 0..k {
            assert_eq!(
                got.get(&key(i)),
                Some(&value(i)),
                "{label}: commit {i} of {k}"
            );
        }
        k
    };
    for seed in 0..12u64 {
        let label = format!("seed {seed}");
        let vfs = SimVfs::new();
        let store = create_sim(&vfs);
        store.put(b"base", b"1").unwrap();
        for i in 0..COMMITS {
            let mut txn = store.begin_write().unwrap();
            txn.set_durability(Durability::Deferred);
            txn.put(&key(i), &value(i)).unwrap();
            txn.commit().unwrap();
        }
        let image = if seed == 0 {
            vfs.crash_keep_all()
        } else {
            vfs.crash(seed)
        };
        drop(store);
        let store = open_sim(&image).unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
        let k = prefix(&store, &label);
        if seed == 0 {
            assert!(
                k >= COMMITS / 2,
                "{label}: only {k} commits were written out"
            );
        }
        verify_clean(&store, &label).unwrap();
        store.put(b"after", b"2").unwrap();
        let image = image.crash_drop_all();
        drop(store);
        let store = open_sim(&image).unwrap_or_else(|e| panic!("{label}: second reopen: {e}"));
        assert_eq!(
            store.get(b"after").unwrap().as_deref(),
            Some(&b"2"[..]),
            "{label}"
        );
        prefix(&store, &label);
        verify_clean(&store, &label).unwrap();
    }
}

/// Zeros ahead of the data stream (`Options::data_zeros_ahead`, off by default): a
/// stream of small commits, synced every few hundred KiB, fills a data segment past the point where the
/// next one is zeroed ahead, then rolls into it and appends over its zeros. Power is
/// cut (seed-chosen loss and tearing of unsynced writes) at several moments: while
/// zeros are written, around the roll, and over the zeros. Every commit acknowledged
/// before the cut is there, nothing else is, `verify` is clean, and the store takes
/// new commits.
#[test]
fn zeros_ahead_of_the_data_stream_survive_power_loss() {
    const VALUE: usize = 1536; // an extent: a small append to the data segment
    const SEGMENT: usize = 64 << 20;
    let vfs = SimVfs::new();
    let opts = cambium::Options {
        data_zeros_ahead: true,
        ..sim_options(&vfs)
    };
    let store = Store::create_with(common::SIM_PATH, opts.clone()).expect("create");
    let value = |i: usize| -> Vec<u8> { (0..VALUE).map(|j| (i * 7 + j) as u8).collect() };
    let key = |i: usize| format!("z{i:06}").into_bytes();
    // Data bytes written when the power is cut: in the zeroing quarter, near the
    // roll, and past it over the zeros.
    let cuts = [
        50 << 20,
        58 << 20,
        63 << 20,
        SEGMENT + (1 << 20),
        SEGMENT + (3 << 20),
    ];
    let total = (cuts[cuts.len() - 1] / VALUE + 1).next_multiple_of(256);
    let mut next_cut = 0;
    let mut zeroed_ahead = 0;
    for i in 0..total {
        // Synced every 256 commits (384 KiB): more than a group commit logs in the
        // WAL in place of syncing the data segment, and less than the 1 MiB gap
        // past which zeros ahead stop. The cuts come right after a sync.
        let mut txn = store.begin_write().expect("begin");
        txn.set_durability(Durability::Deferred);
        txn.put(&key(i), &value(i)).expect("put");
        txn.commit().expect("commit");
        if (i + 1) % 256 == 0 {
            store.sync().expect("sync");
        }
        if next_cut < cuts.len() && (i + 1) * VALUE >= cuts[next_cut] && (i + 1) % 256 == 0 {
            let seed = next_cut as u64;
            let label = format!("cut {next_cut} after {} commits", i + 1);
            next_cut += 1;
            // Before the roll: the next data segment exists, zeroed well ahead.
            let newest = vfs
                .names()
                .into_iter()
                .filter(|n| n.starts_with("seg-"))
                .max();
            if (i + 1) * VALUE < SEGMENT
                && newest.and_then(|n| vfs.file_len(&n)).unwrap_or(0) > 16 << 20
            {
                zeroed_ahead += 1;
            }
            let image = vfs.fork().crash(seed);
            let reopened = Store::open_with(
                common::SIM_PATH,
                cambium::Options {
                    vfs: Some(std::sync::Arc::new(image.clone())),
                    ..opts.clone()
                },
            )
            .unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
            let got = dump(&reopened.read().unwrap()).unwrap();
            assert_eq!(
                got.len(),
                i + 1,
                "{label}: acknowledged commits lost or extra"
            );
            for j in (0..=i).step_by(997).chain([i]) {
                assert_eq!(got.get(&key(j)), Some(&value(j)), "{label}: commit {j}");
            }
            verify_clean(&reopened, &label).unwrap();
            reopened
                .put(b"after", b"1")
                .expect("a commit after recovery");
        }
    }
    assert_eq!(next_cut, cuts.len());
    assert_eq!(
        zeroed_ahead, 3,
        "the next data segment was zeroed ahead at every cut before the roll"
    );
}

/// Power loss while several threads commit concurrently (group commit) and
/// checkpoints run on the background thread (small thresholds): every commit
/// acknowledged before the crash is present after recovery with its value, nothing
/// else but unacknowledged writes of the same threads appears, and `verify()` is
/// clean. Timing-dependent by nature; the seed picks the crash seed and the delay.
#[test]
fn concurrent_commits_then_power_loss() {
    use std::sync::{Arc, Mutex};
    run_seeds(
        "concurrent_commits_then_power_loss",
        "crash_concurrent",
        24,
        |seed| {
            let mut rng = Rng::new(seed ^ 0xC0C0);
            let vfs = SimVfs::new();
            let opts = cambium::Options {
                background_checkpoints: true,
                checkpoint_wal_bytes: 16 * 1024,
                checkpoint_interval: Some(std::time::Duration::from_millis(5)),
                ..sim_options(&vfs)
            };
            let store = ctx(Store::create_with(SIM_PATH, opts), "create")?;
            let acked: Arc<Mutex<Model>> = Arc::default();
            // Errors before the power loss (no fault is injected: each is an engine bug).
            let early: Arc<Mutex<Vec<String>>> = Arc::default();
            let value_of = |key: &[u8]| -> Vec<u8> {
                let n = key.iter().map(|&b| b as usize).sum::<usize>() % 1500;
                key.iter().cycle().take(n).copied().collect()
            };
            let delay = std::time::Duration::from_millis(rng.range(5, 60));
            let image = std::thread::scope(|s| {
                for t in 0..3u8 {
                    let store = store.clone();
                    let acked = acked.clone();
                    let early = early.clone();
                    let vfs = vfs.clone();
                    s.spawn(move || {
                        for i in 0..100_000u32 {
                            let key = format!("t{t}-{i:06}").into_bytes();
                            let value = value_of(&key);
                            let r = if i % 3 == 0 {
                                store.begin_write().and_then(|mut txn| {
                                    txn.set_durability(Durability::Deferred);
                                    txn.put(&key, &value)?;
                                    txn.commit()
                                })
                            } else {
                                store.put(&key, &value)
                            };
                            match r {
                                // Deferred commits are not durable: not recorded.
                                Ok(()) if i % 3 != 0 => {
                                    acked.lock().unwrap().insert(key, value);
                                }
                                Ok(()) => {}
                                Err(e) => {
                                    if !vfs.is_crashed() {
                                        early.lock().unwrap().push(format!("t{t} commit {i}: {e}"));
                                    }
                                    return;
                                }
                            }
                        }
                    });
                }
                std::thread::sleep(delay);
                // Writers keep going until the crash makes their I/O fail.
                vfs.crash(seed)
            });
            drop(store);
            let early = early.lock().unwrap().clone();
            if !early.is_empty() {
                return Err(format!("commits failed before the power loss: {early:?}"));
            }
            let acked = acked.lock().unwrap().clone();
            let recovered = open_sim(&image).map_err(|e| {
                format!(
                    "open after power loss ({} acknowledged): {e} ({e:?})",
                    acked.len()
                )
            })?;
            let got = ctx(recovered.read().and_then(|r| dump(&r)), "read")?;
            for (k, v) in &acked {
                match got.get(k) {
                    Some(g) if g == v => {}
                    Some(_) => {
                        return Err(format!("acknowledged key {} has a wrong value", show(k)))
                    }
                    None => {
                        return Err(format!(
                            "acknowledged key {} lost ({} acknowledged, {} recovered)",
                            show(k),
                            acked.len(),
                            got.len()
                        ))
                    }
                }
            }
            for (k, v) in &got {
                if *v != value_of(k) {
                    return Err(format!(
                        "recovered key {} has a value no writer wrote",
                        show(k)
                    ));
                }
            }
            verify_clean(&recovered, "after concurrent power loss")?;
            let stats = ctx(recovered.stats(), "stats")?;
            eprintln!(
                "concurrent seed {seed}: {} acknowledged, {} recovered, generation {}",
                acked.len(),
                got.len(),
                stats.generation
            );
            Ok(())
        },
    );
}

/// Snapshots made while the cleaner holds the writer lock (it runs them itself, at
/// its lending points: `engine::lend`) and then power loss. A writer overwrites 64
/// keys with ever-growing sequence numbers, so every snapshot must be the state after
/// one sequence number (a consistent cut that holds every write acknowledged before
/// the snapshot was asked for); a cleaner moves the live data again and again; a
/// third thread makes durable snapshots and reads each back at once. After the
/// crash, every snapshot acknowledged is there with exactly what was read back then,
/// and `verify()` is clean. Over all seeds, some snapshot must have been lent.
#[test]
fn snapshots_lent_by_the_cleaner_then_power_loss() {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    const KEYS: u64 = 64;
    let key_of = |i: u64| format!("k{:03}", i % KEYS).into_bytes();
    let value_of = |i: u64| format!("{i:012}-{}", "v".repeat((i % 7) as usize * 300)).into_bytes();
    let seq_of = |v: &[u8]| -> Option<u64> { std::str::from_utf8(v.get(..12)?).ok()?.parse().ok() };
    let lent_total = AtomicU64::new(0);
    run_seeds(
        "snapshots_lent_by_the_cleaner_then_power_loss",
        "crash_lent",
        8,
        |seed| {
            let mut rng = Rng::new(seed ^ 0x1E47);
            let vfs = SimVfs::new();
            let opts = cambium::Options {
                background_checkpoints: true,
                checkpoint_interval: Some(std::time::Duration::from_millis(20)),
                auto_clean_dead_percent: None,
                ..sim_options(&vfs)
            };
            let store = ctx(Store::create_with(SIM_PATH, opts), "create")?;
            // The highest sequence number acknowledged (durable) so far, plus one.
            let acked = AtomicU64::new(0);
            let snapshots: Arc<Mutex<Vec<(String, Model)>>> = Arc::default();
            let early: Arc<Mutex<Vec<String>>> = Arc::default();
            let stop = AtomicBool::new(false);
            let delay = std::time::Duration::from_millis(rng.range(150, 400));
            let mut lent = 0;
            let image = std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0.. {
                        match store.put(&key_of(i), &value_of(i)) {
                            Ok(()) => acked.store(i + 1, Ordering::SeqCst),
                            Err(e) => {
                                if !vfs.is_crashed() {
                                    early.lock().unwrap().push(format!("put {i}: {e}"));
                                }
                                return;
                            }
                        }
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                });
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = store.clean(0.0) {
                            if !vfs.is_crashed() {
                                early.lock().unwrap().push(format!("clean: {e}"));
                            }
                            return;
                        }
                    }
                });
                s.spawn(|| {
                    for n in 0.. {
                        let name = format!("snap{n}");
                        let floor = acked.load(Ordering::SeqCst);
                        let made = store
                            .snapshot("main", &name)
                            .and_then(|()| store.read_at(&name).and_then(|r| dump(&r)));
                        let got = match made {
                            Ok(got) => got,
                            Err(e) => {
                                if !vfs.is_crashed() {
                                    early.lock().unwrap().push(format!("{name}: {e}"));
                                }
                                return;
                            }
                        };
                        // A consistent cut: the state right after sequence number `cut`.
                        let cut = got.values().filter_map(|v| seq_of(v)).max();
                        let ok = cut.is_some_and(|cut| {
                            cut + 1 >= floor
                                && got.len() as u64 == KEYS.min(cut + 1)
                                && got.iter().all(|(k, v)| {
                                    let last = (0..=cut).rev().find(|i| key_of(*i) == *k);
                                    last.is_some_and(|i| *v == value_of(i))
                                })
                        }) || (floor == 0 && got.is_empty());
                        if !ok {
                            early.lock().unwrap().push(format!(
                                "{name} is not the state after one write (asked after {floor})"
                            ));
                            return;
                        }
                        snapshots.lock().unwrap().push((name, got));
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                });
                std::thread::sleep(delay);
                lent = store.stats().map_or(0, |s| s.version_ops_lent);
                let image = vfs.crash(seed);
                stop.store(true, Ordering::Relaxed);
                image
            });
            drop(store);
            lent_total.fetch_add(lent, Ordering::Relaxed);
            let early = early.lock().unwrap().clone();
            if !early.is_empty() {
                // Say whether the durable state is sound too (a failed clean may be
                // a check that worked or a state gone wrong).
                let durable = open_sim(&image)
                    .map_err(|e| e.to_string())
                    .and_then(|s| verify_clean(&s, "after power loss"));
                return Err(format!(
                    "failures before the power loss: {early:?}; recovered: {durable:?}"
                ));
            }
            let recovered = ctx(open_sim(&image), "open after power loss")?;
            let snapshots = snapshots.lock().unwrap().clone();
            for (name, want) in &snapshots {
                let got = ctx(recovered.read_at(name).and_then(|r| dump(&r)), name)?;
                if got != *want {
                    return Err(format!("snapshot {name} changed across the power loss"));
                }
            }
            verify_clean(&recovered, "after power loss")?;
            eprintln!(
                "lent seed {seed}: {} snapshots, {lent} lent by the cleaner",
                snapshots.len()
            );
            Ok(())
        },
    );
    assert!(
        lent_total.load(Ordering::Relaxed) > 0,
        "no snapshot was ever made while the cleaner held the writer lock"
    );
}

/// The cleaner crashed at every I/O operation of a `clean` in turn (capped at 150
/// points, several crash modes each): a relocation commits by a checkpoint of its own,
/// after logging a record for its LSN that replay skips, so recovery from the
/// superblock before that checkpoint (the crash came first) or after it must both
/// give back every version exactly, and `verify()` must be clean.
#[test]
fn cleaning_crashed_at_every_operation() {
    fn setup() -> Result<(SimVfs, Store, Model, Model), String> {
        let vfs = SimVfs::new();
        let store = create_sim(&vfs);
        let value = |i: u32, round: u32| -> Vec<u8> {
            let len = if i.is_multiple_of(9) {
                20_000
            } else {
                60 + (i % 5) as usize * 40
            };
            format!("{round}-{i}-").bytes().cycle().take(len).collect()
        };
        let mut main = Model::new();
        for i in 0..3_000u32 {
            let key = format!("k{i:05}").into_bytes();
            ctx(store.put(&key, &value(i, 0)), "put")?;
            main.insert(key, value(i, 0));
        }
        ctx(store.snapshot("main", "s1"), "snapshot")?;
        let s1 = main.clone();
        for i in (0..3_000u32).step_by(2) {
            let key = format!("k{i:05}").into_bytes();
            ctx(store.put(&key, &value(i, 1)), "overwrite")?;
            main.insert(key, value(i, 1));
        }
        ctx(store.checkpoint(), "checkpoint")?;
        Ok((vfs, store, main, s1))
    }
    run_seeds(
        "cleaning_crashed_at_every_operation",
        "crash_clean",
        1,
        |seed| {
            let (vfs, store, _, _) = setup()?;
            let start = vfs.op_count();
            let report = ctx(store.clean(0.0), "clean without faults")?;
            if report.blocks_moved == 0 {
                return Err("the setup leaves the cleaner nothing to move".into());
            }
            let total = vfs.op_count() - start;
            drop(store);
            let stride = (total / 150).max(1);
            for k in (0..total).step_by(stride as usize) {
                let (vfs, store, main, s1) = setup()?;
                vfs.set_fail_after(Some(k));
                let failed = store.clean(0.0).is_err();
                let crash_seed = seed.wrapping_mul(1000).wrapping_add(k);
                let image = vfs.crash(crash_seed);
                drop(store);
                let at = format!("crash at op {k} of {total} (clean failed: {failed})");
                let recovered = ctx(open_sim(&image), format!("{at}: open"))?;
                for (name, want) in [("main", &main), ("s1", &s1)] {
                    let got = ctx(recovered.read_at(name).and_then(|r| dump(&r)), &at)?;
                    if got != *want {
                        return Err(format!("{at}: {name} differs after recovery"));
                    }
                }
                verify_clean(&recovered, &at)?;
            }
            eprintln!("cleaning_crashed_at_every_operation: {total} ops, stride {stride}");
            Ok(())
        },
    );
}

/// Commits that overwrite `keys` keys in turn with 4 KiB values, [`Rewrites::PER_TXN`]
/// a commit (256 KiB, written past the page cache), so that data segments empty as
/// they go: the spare-file tests' load.
struct Rewrites {
    keys: usize,
}

impl Rewrites {
    const PER_TXN: usize = 64;

    fn key(k: usize) -> Vec<u8> {
        format!("r{k:05}").into_bytes()
    }

    fn value(t: usize, k: usize) -> Vec<u8> {
        let mut v = vec![(t % 251) as u8; 4096];
        v[..16].copy_from_slice(&format!("{t:08}/{k:07}").into_bytes());
        v
    }

    /// Commit number `t`.
    fn txn(&self, store: &Store, t: usize) -> cambium::Result<()> {
        let mut w = store.begin_write()?;
        for j in 0..Self::PER_TXN {
            let k = (t * Self::PER_TXN + j) % self.keys;
            w.put(&Self::key(k), &Self::value(t, k))?;
        }
        w.commit()
    }

    /// The store after `done` commits: each key's value from the last commit writing it.
    fn expect(&self, done: usize) -> Model {
        let mut m = Model::new();
        for t in done.saturating_sub(self.keys / Self::PER_TXN)..done {
            for j in 0..Self::PER_TXN {
                let k = (t * Self::PER_TXN + j) % self.keys;
                m.insert(Self::key(k), Self::value(t, k));
            }
        }
        m
    }
}

/// The spare files on `vfs`, by name.
fn spare_files(vfs: &SimVfs) -> Vec<String> {
    vfs.names()
        .into_iter()
        .filter(|n| n.starts_with("spare-"))
        .collect()
}

/// Emptied data segments are kept as spare files and the data stream's next segment
/// is made from one (a new header, synced, then a rename): power cuts at every
/// operation of the commit whose follow-up recycles a spare, and again after more
/// data went into recycled segments. Every acknowledged commit reads back, a commit
/// cut short is all there or not at all, spare files left by the cut are adopted by
/// the open (nothing lives in them), `verify` is clean, and the store takes new
/// commits, into the spares it adopted, that survive the next cut. The case the test
/// is about (a spare recycled) must occur.
#[test]
fn recycled_data_segments_survive_power_loss() {
    let load = Rewrites { keys: 256 };
    let opts = |vfs: &SimVfs| cambium::Options {
        checkpoint_data_bytes: 16 << 20,
        ..sim_options(vfs)
    };
    let txn = |store: &Store, t: usize| load.txn(store, t);
    let expect = |done: usize| load.expect(done);
    let spares = |vfs: &SimVfs| spare_files(vfs).len();

    // The probe: the first commit after which a spare became a segment.
    let probe = SimVfs::new();
    let store = Store::create_with(common::SIM_PATH, opts(&probe)).expect("create");
    let mut recycling = None;
    for t in 0..2_000 {
        let before = spares(&probe);
        let ops = probe.op_count();
        txn(&store, t).expect("commit");
        if before > 0 && spares(&probe) < before {
            recycling = Some((t, probe.op_count() - ops));
            break;
        }
    }
    let (t_recycle, ops) = recycling.expect("a spare file was recycled");
    // Power cuts once data went into recycled segments: forks of the probe.
    let mut done = t_recycle + 1;
    for cut in 0..4 {
        for t in done..done + 173 {
            txn(&store, t).expect("commit");
        }
        done += 173;
        let label = format!("cut {cut} after {done} commits");
        let image = probe.fork().crash(cut as u64);
        let left = spares(&image);
        let reopened = Store::open_with(common::SIM_PATH, opts(&image))
            .unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
        assert_eq!(
            dump(&reopened.read().unwrap()).unwrap(),
            expect(done),
            "{label}"
        );
        // Adopted for the data stream to reuse, up to the limit (two files here).
        assert!(
            spares(&image) >= left.min(2),
            "{label}: {left} spare files left, {} after the open",
            spares(&image)
        );
        verify_clean(&reopened, &label).unwrap();
    }
    drop(store);

    // A fault at each operation of the recycling commit, then a power cut.
    let mut cut_with_spare = 0;
    for k in 0..ops {
        let label = format!("fault at op {k} of {ops} of commit {t_recycle}");
        let vfs = SimVfs::new();
        let store = Store::create_with(common::SIM_PATH, opts(&vfs)).expect("create");
        for t in 0..t_recycle {
            txn(&store, t).expect("commit");
        }
        vfs.set_fail_after(Some(k));
        let acknowledged = txn(&store, t_recycle).is_ok();
        let image = vfs.crash(k);
        drop(store);
        let left = spares(&image);
        if left > 0 {
            cut_with_spare += 1;
        }
        let store = Store::open_with(common::SIM_PATH, opts(&image))
            .unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
        let got = dump(&store.read().unwrap()).unwrap();
        let done = if got == expect(t_recycle + 1) {
            t_recycle + 1
        } else {
            assert!(!acknowledged, "{label}: an acknowledged commit lost");
            assert_eq!(got, expect(t_recycle), "{label}: a commit cut in half");
            t_recycle
        };
        assert!(
            spares(&image) >= left.min(2),
            "{label}: {left} spare files left, {} after the open",
            spares(&image)
        );
        verify_clean(&store, &label).unwrap();
        // More commits (the next roll, into a recycled segment: one the crash left,
        // if any), then another cut.
        for t in done..done + 100 {
            txn(&store, t).unwrap_or_else(|e| panic!("{label}: commit {t} after recovery: {e}"));
        }
        let image = image.crash(k + 1);
        drop(store);
        let store = Store::open_with(common::SIM_PATH, opts(&image))
            .unwrap_or_else(|e| panic!("{label}: second reopen: {e}"));
        assert_eq!(
            dump(&store.read().unwrap()).unwrap(),
            expect(done + 100),
            "{label}: after the second cut"
        );
        verify_clean(&store, &label).unwrap();
    }
    assert!(cut_with_spare > 0, "no cut found a spare file on disk");
}

/// With `Options::keep_spares_at_close` (as `cambium serve` sets it) a clean close
/// keeps the spare files, the next open adopts them, and that process's data stream
/// makes its next segments from them: power cuts after data went into an adopted
/// spare lose no acknowledged commit, and `verify` is clean. Without the option a
/// close removes them.
#[test]
fn spares_kept_at_a_close_are_reused_by_the_next_process() {
    // 64 MiB live: a spare kept is within the segments' bytes.
    let load = Rewrites { keys: 16_384 };
    let opts = |vfs: &SimVfs, keep: bool| cambium::Options {
        checkpoint_data_bytes: 16 << 20,
        keep_spares_at_close: keep,
        ..sim_options(vfs)
    };
    let txn = |store: &Store, t: usize| load.txn(store, t);
    let expect = |done: usize| load.expect(done);
    let spares = spare_files;

    // A process that writes until it holds spare files, and closes.
    let vfs = SimVfs::new();
    let store = Store::create_with(common::SIM_PATH, opts(&vfs, true)).expect("create");
    let mut done = 0;
    while spares(&vfs).is_empty() {
        assert!(done < 4_000, "no emptied segment became a spare");
        txn(&store, done).expect("commit");
        done += 1;
    }
    drop(store);
    let kept = spares(&vfs);
    assert!(!kept.is_empty(), "a clean close kept no spare file");

    // The next process adopts them and writes into them.
    let store = Store::open_with(common::SIM_PATH, opts(&vfs, true)).expect("reopen");
    assert_eq!(spares(&vfs), kept, "the open adopted the spare files");
    assert_eq!(dump(&store.read().unwrap()).unwrap(), expect(done));
    let mut reused = false;
    for _ in 0..4_000 {
        txn(&store, done).expect("commit");
        done += 1;
        if spares(&vfs).len() < kept.len() {
            reused = true;
            break;
        }
    }
    assert!(reused, "no adopted spare became a segment");
    // Power cuts once data went into it (forks, so the writer goes on).
    for cut in 0..4u64 {
        for t in done..done + 97 {
            txn(&store, t).expect("commit");
        }
        done += 97;
        let label = format!("cut {cut} after {done} commits");
        let image = vfs.fork().crash(cut);
        let reopened = Store::open_with(common::SIM_PATH, opts(&image, true))
            .unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
        assert_eq!(
            dump(&reopened.read().unwrap()).unwrap(),
            expect(done),
            "{label}"
        );
        verify_clean(&reopened, &label).unwrap();
    }
    drop(store);

    // A process without the option gives their space back at its close.
    let store = Store::open_with(common::SIM_PATH, opts(&vfs, false)).expect("reopen");
    verify_clean(&store, "after the cuts").unwrap();
    drop(store);
    assert_eq!(
        spares(&vfs),
        Vec::<String>::new(),
        "spare files left at a close"
    );
}

/// What the writer published as durable (`LOCK`'s record) survives a crash of the
/// simulated file system, as the file does: after a process kill, a log cut back
/// below it from outside is corruption, never an older state opened silently. (The
/// simulated file system used to forget it at every crash, so no crash test here
/// ran with a `LOCK` that survives.)
#[test]
fn a_log_cut_below_what_was_published_is_corruption_after_a_crash() {
    let vfs = SimVfs::new();
    let opts = cambium::Options {
        checkpoint_on_close: false,
        ..sim_options(&vfs)
    };
    let store = Store::create_with(SIM_PATH, opts.clone()).unwrap();
    for i in 0..200u32 {
        store
            .put(format!("k{i:04}").as_bytes(), &[7u8; 300])
            .unwrap();
    }
    drop(store);
    // Every commit is in the log only (no checkpoint on close).
    let intact = vfs.fork();
    let killed = vfs.crash_keep_all();
    let log = newest_file(&killed, "wal-");
    let bytes = killed.read_file(&log).unwrap();
    // Half of its records (zeros follow them: the log is written ahead of itself).
    let records = bytes.iter().rposition(|&b| b != 0).expect("records");
    killed.write_file(&log, &bytes[..records / 2]);
    let opened = Store::open_with(
        SIM_PATH,
        cambium::Options {
            vfs: Some(std::sync::Arc::new(killed)),
            ..opts
        },
    );
    match opened {
        Err(e) => assert!(e.is_corruption(), "not a corruption error: {e}"),
        Ok(store) => panic!(
            "opened with {} of 200 keys from a log cut short",
            dump(&store.read().unwrap()).unwrap().len()
        ),
    }
    // The same kill without the cut reopens with every commit.
    let store = Store::open_with(
        SIM_PATH,
        cambium::Options {
            vfs: Some(std::sync::Arc::new(intact.crash_keep_all())),
            ..sim_options(&vfs)
        },
    )
    .unwrap();
    assert_eq!(dump(&store.read().unwrap()).unwrap().len(), 200);
}
