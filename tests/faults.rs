//! I/O fault injection tests on the simulated file system.
//!
//! Method: a seeded workload of write transactions (Immediate and Deferred), one-shot
//! puts, checkpoints and reads runs on a store over [`SimVfs`]. The workload is run
//! once to count its mutating I/O operations, then re-run with a fault armed at a
//! random operation index: persistent (every later mutating operation fails) or
//! transient (exactly one operation fails). The workload carries on after errors.
//! Finally the faults are disarmed and the store is closed (errors allowed) and
//! reopened, or the file system is crashed and the store reopened from the image.
//! Faults during recovery: a store with un-checkpointed WAL records is opened with a
//! fault armed at each operation of the open in turn.
//!
//! Invariants:
//! - no operation panics; an operation hit by a fault returns `Err`;
//! - a commit that returned `Err` is not visible to readers of the live store, and
//!   the live store's readable state always equals the acknowledged commits (or
//!   reads return `Err`, e.g. `Poisoned`);
//! - after reopening, nothing acknowledged-durable is lost: the state equals the
//!   model after `k` acknowledged commits, `k` at least the last durable one (all of
//!   them after a clean reopen following a successful close). A commit that
//!   returned `Err` may appear after reopening only if no commit was acknowledged
//!   after it (otherwise the engine kept going past a failed write and resurrected
//!   data it had reported as failed);
//! - `verify()` is clean after reopening;
//! - an open that hits a fault returns `Err` (or succeeds with correct data), and a
//!   later open without faults succeeds with every acknowledged commit.
//!
//! - read faults (`read_exact_at` failing) during open, point reads, scans and
//!   verify give right data or `Err`, and leave nothing bad behind once gone.
//!
//! Replay one seed with `CAMBIUM_SEED=N`; scale with `CAMBIUM_FAULT_CASES=N`.

mod common;

use cambium::io::sim::SimVfs;
use cambium::{Durability, Store};
use common::*;

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// One transaction's writes.
type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn apply(model: &Model, writes: &Writes) -> Model {
    let mut m = model.clone();
    for (k, v) in writes {
        match v {
            Some(v) => m.insert(k.clone(), v.clone()),
            None => m.remove(k),
        };
    }
    m
}

/// Acknowledged history plus the failed commits that may have reached the disk.
struct Tracker {
    /// `states[i]`: the model after `i` acknowledged commits.
    states: Vec<Model>,
    /// Newest index known durable.
    durable: usize,
    /// States that include failed commits issued after the last acknowledged one.
    trailing_failed: Vec<Model>,
    /// Every error seen, for diagnostics.
    errors: Vec<String>,
}

impl Tracker {
    fn current(&self) -> &Model {
        self.states.last().unwrap()
    }
    fn ok_commit(&mut self, writes: &Writes, durable: bool) {
        let next = apply(self.current(), writes);
        self.states.push(next);
        self.trailing_failed.clear();
        if durable {
            self.durable = self.states.len() - 1;
        }
    }
    fn failed_commit(&mut self, writes: &Writes, err: String) {
        self.errors.push(err);
        let mut more: Vec<Model> = self
            .trailing_failed
            .iter()
            .map(|m| apply(m, writes))
            .collect();
        more.push(apply(self.current(), writes));
        for m in more {
            if self.trailing_failed.len() < 64 && !self.trailing_failed.contains(&m) {
                self.trailing_failed.push(m);
            }
        }
    }
    fn all_durable(&mut self) {
        self.durable = self.states.len() - 1;
    }
    fn check_recovered(&self, got: &Model, exact: bool) -> Result<(), String> {
        let lo = if exact {
            self.states.len() - 1
        } else {
            self.durable
        };
        if self.states[lo..].iter().any(|s| s == got)
            || self.trailing_failed.iter().any(|s| s == got)
        {
            return Ok(());
        }
        let lost = (0..lo).rev().find(|&k| &self.states[k] == got);
        Err(format!(
            "recovered state is not allowed (acknowledged commits {}, durable {}, exact {exact}, {} trailing failed-commit states): {}; vs newest acknowledged: {}; errors seen: {:?}",
            self.states.len() - 1,
            self.durable,
            self.trailing_failed.len(),
            match lost {
                Some(k) => format!("equals the state after commit {k}: ACKNOWLEDGED COMMITS LOST"),
                None => "equals no acknowledged prefix (a failed commit resurrected, or garbage)".into(),
            },
            diff(got, self.current()).unwrap_or_else(|| "equal".into()),
            self.errors.iter().take(4).collect::<Vec<_>>(),
        ))
    }
}

/// The live store's view must equal the acknowledged state (or reads fail).
fn check_live(store: &Store, t: &Tracker, step: usize) -> Result<(), String> {
    let got = match store.read().and_then(|r| dump(&r)) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    if &got == t.current() {
        return Ok(());
    }
    let failed_visible = t.trailing_failed.contains(&got);
    Err(format!(
        "step {step}: live store state differs from the acknowledged commits{}: {}",
        if failed_visible {
            " (A FAILED COMMIT IS VISIBLE)"
        } else {
            ""
        },
        diff(&got, t.current()).unwrap()
    ))
}

/// Runs the workload; never stops on errors. Returns the store if still held.
fn workload(store: Store, rng: &mut Rng, t: &mut Tracker, steps: usize) -> Result<Store, String> {
    for step in 0..steps {
        let had_errors = t.errors.len();
        match rng.below(100) {
            0..=59 => {
                let durability = if rng.chance(1, 3) {
                    Durability::Deferred
                } else {
                    Durability::Immediate
                };
                let mut writes = Writes::new();
                let mut shadow = t.current().clone();
                for _ in 0..rng.usize(1, 6) {
                    let key = gen_key(rng, &shadow);
                    if rng.chance(3, 4) {
                        let v = gen_value(rng);
                        shadow.insert(key.clone(), v.clone());
                        writes.push((key, Some(v)));
                    } else {
                        shadow.remove(&key);
                        writes.push((key, None));
                    }
                }
                let result = (|| {
                    let mut txn = store.begin_write()?;
                    txn.set_durability(durability);
                    for (k, v) in &writes {
                        match v {
                            Some(v) => txn.put(k, v)?,
                            None => {
                                txn.delete(k)?;
                            }
                        }
                    }
                    txn.commit()
                })();
                match result {
                    Ok(()) => t.ok_commit(&writes, durability == Durability::Immediate),
                    Err(e) => t.failed_commit(&writes, format!("step {step}: commit: {e}")),
                }
            }
            60..=69 => {
                let key = gen_key(rng, t.current());
                let v = gen_value(rng);
                let writes = vec![(key.clone(), Some(v.clone()))];
                match store.put(&key, &v) {
                    Ok(()) => t.ok_commit(&writes, true),
                    Err(e) => t.failed_commit(&writes, format!("step {step}: store.put: {e}")),
                }
            }
            70..=84 => match store.checkpoint() {
                Ok(()) => t.all_durable(),
                Err(e) => t.errors.push(format!("step {step}: checkpoint: {e}")),
            },
            _ => {
                // Point reads: correct or an error.
                let key = gen_key(rng, t.current());
                if let Ok(v) = store.get(&key) {
                    if v.as_ref() != t.current().get(&key) {
                        return Err(format!(
                            "step {step}: get({}) returned wrong data",
                            show(&key)
                        ));
                    }
                }
            }
        }
        if t.errors.len() > had_errors || rng.chance(1, 10) {
            check_live(&store, t, step)?;
        }
    }
    Ok(store)
}

/// Builds a store and runs the workload with the given fault; returns the file
/// system, the store, the tracker and the number of mutating operations.
fn run(
    seed: u64,
    steps: usize,
    fault: Option<(bool, u64)>,
) -> Result<(SimVfs, Store, Tracker, u64), String> {
    let mut rng = Rng::new(seed);
    let vfs = SimVfs::new();
    let store = create_sim(&vfs);
    let start = vfs.op_count();
    match fault {
        Some((true, k)) => vfs.set_fail_after(Some(k)),
        Some((false, k)) => vfs.set_fail_once_after(Some(k)),
        None => {}
    }
    let mut t = Tracker {
        states: vec![Model::new()],
        durable: 0,
        trailing_failed: Vec::new(),
        errors: Vec::new(),
    };
    let store = workload(store, &mut rng, &mut t, steps)?;
    if fault.is_none() && !t.errors.is_empty() {
        return Err(format!("errors without any fault armed: {:?}", t.errors));
    }
    let ops = vfs.op_count() - start;
    Ok((vfs, store, t, ops))
}

/// Faults at a random operation of a random workload; then a clean reopen or a
/// crash and reopen.
#[test]
fn faults_during_commits_and_checkpoints() {
    run_seeds(
        "faults_during_commits_and_checkpoints",
        "fault",
        250,
        |seed| {
            let mut rng = Rng::new(seed ^ 0xFA17);
            let steps = rng.usize(5, 40);
            let (_, store, _, total) = run(seed, steps, None)?;
            drop(store);
            let persistent = rng.chance(1, 2);
            let k = rng.below(total.max(1));
            let (vfs, store, mut t, _) = run(seed, steps, Some((persistent, k)))?;
            if t.errors.is_empty() {
                return Err(format!(
                    "fault at op {k} of {total} (persistent {persistent}) produced no error"
                ));
            }
            vfs.set_fail_after(None);
            vfs.set_fail_once_after(None);
            let label = format!("fault at op {k}/{total} persistent={persistent}");
            let crash = rng.chance(1, 3);
            let (image, exact) = if crash {
                let image = vfs.crash(seed);
                drop(store);
                (image, false)
            } else {
                // Close (may fail if poisoned, then it is like dropping it).
                let closed = store.close().is_ok();
                if closed {
                    t.all_durable();
                }
                (vfs, closed)
            };
            let store =
                open_sim(&image).map_err(|e| format!("{label}: reopen failed: {e} ({e:?})"))?;
            let got = ctx(
                store.read().and_then(|r| dump(&r)),
                format!("{label}: read after reopen"),
            )?;
            t.check_recovered(&got, exact)
                .map_err(|e| format!("{label} (crash {crash}): {e}"))?;
            verify_clean(&store, &format!("{label}: after reopen"))?;
            // The reopened store works.
            ctx(
                store.put(b"after", b"faults"),
                format!("{label}: put after reopen"),
            )?;
            ctx(
                store.checkpoint(),
                format!("{label}: checkpoint after reopen"),
            )?;
            verify_clean(&store, &format!("{label}: after checkpoint"))?;
            Ok(())
        },
    );
}

/// A transient fault at each operation of a single commit and of a single
/// checkpoint in turn: the operation returns `Err`, and the store either keeps
/// working or reports `Poisoned` (then a reopen recovers everything acknowledged).
#[test]
fn transient_fault_at_each_operation() {
    run_seeds(
        "transient_fault_at_each_operation",
        "fault_each",
        4,
        |seed| {
            let seed = seed + 50_000;
            // Measure the operations of one commit and of one checkpoint.
            let prepare = || -> Result<(SimVfs, Store, Tracker), String> {
                let (vfs, store, t, _) = run(seed, 25, None)?;
                Ok((vfs, store, t))
            };
            let (vfs, store, _) = prepare()?;
            let a = vfs.op_count();
            ctx(store.put(b"probe", &[7u8; 3000]), "probe commit")?;
            let b = vfs.op_count();
            ctx(store.checkpoint(), "probe checkpoint")?;
            let c = vfs.op_count();
            drop(store);
            for (what, n) in [("commit", b - a), ("checkpoint", c - b)] {
                for k in 0..n {
                    let (vfs, store, mut t) = prepare()?;
                    let label = format!("transient fault at op {k}/{n} of a {what}");
                    let writes = vec![(b"probe".to_vec(), Some(vec![7u8; 3000]))];
                    if what == "commit" {
                        vfs.set_fail_once_after(Some(k));
                        // Ok is acceptable only if the engine retried the failed operation.
                        match store.put(b"probe", &[7u8; 3000]) {
                            Ok(()) => t.ok_commit(&writes, true),
                            Err(e) => t.failed_commit(&writes, e.to_string()),
                        }
                    } else {
                        ctx(store.put(b"probe", &[7u8; 3000]), "commit")?;
                        t.ok_commit(&writes, true);
                        vfs.set_fail_once_after(Some(k));
                        if store.checkpoint().is_ok() {
                            t.all_durable();
                        }
                    }
                    check_live(&store, &t, 0).map_err(|e| format!("{label}: {e}"))?;
                    // Later operations either work or fail cleanly.
                    let later = store.put(b"later", b"1");
                    if later.is_ok() {
                        t.ok_commit(&vec![(b"later".to_vec(), Some(b"1".to_vec()))], true);
                        check_live(&store, &t, 1).map_err(|e| format!("{label}: {e}"))?;
                        ctx(
                            store.checkpoint(),
                            format!("{label}: checkpoint after a successful later commit"),
                        )?;
                        t.all_durable();
                    }
                    drop(store);
                    let store = open_sim(&vfs).map_err(|e| format!("{label}: reopen: {e}"))?;
                    let got = ctx(
                        store.read().and_then(|r| dump(&r)),
                        format!("{label}: read after reopen"),
                    )?;
                    t.check_recovered(&got, false)
                        .map_err(|e| format!("{label}: {e}"))?;
                    verify_clean(&store, &label)?;
                }
            }
            Ok(())
        },
    );
}

/// Faults while opening (recovering) a store with un-checkpointed WAL records: the
/// open returns `Err` or succeeds with the right data; a later clean open (also after
/// a crash of the half-recovered image) recovers every acknowledged commit.
#[test]
fn faults_during_recovery() {
    run_seeds("faults_during_recovery", "fault_recovery", 10, |seed| {
        let mut rng = Rng::new(seed ^ 0x2EC0);
        let vfs = SimVfs::new();
        let opts = cambium::Options {
            checkpoint_on_close: false,
            ..sim_options(&vfs)
        };
        let store = ctx(Store::create_with(SIM_PATH, opts), "create")?;
        let mut model = Model::new();
        for i in 0..rng.usize(10, 60) {
            let key = gen_key(&mut rng, &model);
            let value = gen_value(&mut rng);
            ctx(store.put(&key, &value), "put")?;
            model.insert(key, value);
            if i == 5 {
                ctx(store.checkpoint(), "checkpoint")?;
            }
        }
        // Dropped without close: the image needs WAL replay.
        drop(store);
        let image = vfs.fork();
        let measure = image.fork();
        let before = measure.op_count();
        let s = ctx(open_sim(&measure), "clean open")?;
        let open_ops = measure.op_count() - before;
        drop(s);
        for k in 0..=open_ops + 1 {
            for persistent in [true, false] {
                for crash in [false, true] {
                    let v = image.fork();
                    if persistent {
                        v.set_fail_after(Some(k));
                    } else {
                        v.set_fail_once_after(Some(k));
                    }
                    let label = format!(
                        "fault at open op {k}/{open_ops} persistent={persistent} crash={crash}"
                    );
                    if let Ok(s) = open_sim(&v) {
                        if let Ok(got) = s.read().and_then(|r| dump(&r)) {
                            if let Some(d) = diff(&got, &model) {
                                return Err(format!(
                                    "{label}: open succeeded with wrong data: {d}"
                                ));
                            }
                        }
                    }
                    v.set_fail_after(None);
                    v.set_fail_once_after(None);
                    let v = if crash { v.crash(seed * 1000 + k) } else { v };
                    let s = open_sim(&v).map_err(|e| {
                        format!("{label}: open after the fault failed: {e} ({e:?})")
                    })?;
                    let got = ctx(s.read().and_then(|r| dump(&r)), format!("{label}: read"))?;
                    if let Some(d) = diff(&got, &model) {
                        return Err(format!("{label}: {d}"));
                    }
                    verify_clean(&s, &label)?;
                }
            }
        }
        Ok(())
    });
}

/// Read errors (`read_exact_at` failing, persistently or once) while opening,
/// reading, scanning and verifying a checkpointed store with a small cache: every
/// operation returns the right data or an `Err`, never a panic or wrong data; once
/// the fault is gone, the same store instance reads everything correctly (a failed
/// read must not leave a bad node in the cache) and a reopen is clean.
#[test]
fn read_faults() {
    run_seeds("read_faults", "fault_read", 2, |seed| {
        let mut rng = Rng::new(seed ^ 0x4EAD);
        let vfs = SimVfs::new();
        let opts = cambium::Options {
            cache_bytes: 32 * 1024,
            ..sim_options(&vfs)
        };
        let store = ctx(Store::create_with(SIM_PATH, opts.clone()), "create")?;
        let mut model = Model::new();
        for round in 0..8 {
            let mut txn = ctx(store.begin_write(), "begin")?;
            for _ in 0..60 {
                let key = gen_key(&mut rng, &model);
                let value = gen_value(&mut rng);
                ctx(txn.put(&key, &value), "put")?;
                model.insert(key, value);
            }
            ctx(txn.commit(), "commit")?;
            if round % 3 == 0 {
                ctx(store.checkpoint(), "checkpoint")?;
            }
        }
        ctx(store.close(), "close")?;
        let image = vfs.fork();
        // Everything a read pass does, returning the first wrong answer.
        let pass = |store: &Store| -> Result<u64, String> {
            let mut errors = 0;
            let read = match store.read() {
                Ok(r) => r,
                Err(_) => return Ok(1),
            };
            for (k, v) in &model {
                match read.get(k) {
                    Ok(Some(got)) if &got == v => {}
                    Ok(other) => {
                        return Err(format!(
                            "get({}) returned wrong data: {:?} bytes",
                            show(k),
                            other.map(|g| g.len())
                        ))
                    }
                    Err(_) => errors += 1,
                }
            }
            for reverse in [false, true] {
                let Ok(iter) = read.iter() else {
                    errors += 1;
                    continue;
                };
                let items: Box<dyn Iterator<Item = cambium::Result<Entry>>> = if reverse {
                    Box::new(iter.rev())
                } else {
                    Box::new(iter)
                };
                let mut want: Box<dyn Iterator<Item = (&Vec<u8>, &Vec<u8>)>> = if reverse {
                    Box::new(model.iter().rev())
                } else {
                    Box::new(model.iter())
                };
                for item in items {
                    match item {
                        Ok((k, v)) => match want.next() {
                            Some((wk, wv)) if *wk == k && *wv == v => {}
                            _ => {
                                return Err(format!(
                                    "scan (reverse {reverse}) returned wrong data at {}",
                                    show(&k)
                                ))
                            }
                        },
                        Err(_) => {
                            errors += 1;
                            break;
                        }
                    }
                }
            }
            if store.verify().is_err() {
                errors += 1;
            }
            Ok(errors)
        };
        // Reads of one clean open + pass.
        let measure = image.fork();
        let s = ctx(
            Store::open_with(
                SIM_PATH,
                cambium::Options {
                    vfs: Some(std::sync::Arc::new(measure.clone())),
                    ..opts.clone()
                },
            ),
            "open",
        )?;
        if pass(&s)? != 0 {
            return Err("errors without any fault".into());
        }
        let total = measure.read_count();
        drop(s);
        let mut errored = 0;
        let points = 40u64;
        for p in 0..points {
            let k = p * total / points + rng.below((total / points).max(1));
            let persistent = p % 2 == 0;
            let label = format!("read fault at read {k}/{total} persistent={persistent}");
            let v = image.fork();
            if persistent {
                v.set_read_fail_after(Some(k));
            } else {
                v.set_read_fail_once_after(Some(k));
            }
            let o = cambium::Options {
                vfs: Some(std::sync::Arc::new(v.clone())),
                ..opts.clone()
            };
            match Store::open_with(SIM_PATH, o.clone()) {
                Ok(s) => {
                    errored += pass(&s).map_err(|e| format!("{label}: {e}"))?;
                    v.set_read_fail_after(None);
                    v.set_read_fail_once_after(None);
                    if pass(&s).map_err(|e| format!("{label}, after the fault: {e}"))? != 0 {
                        return Err(format!("{label}: reads still fail after the fault is gone"));
                    }
                    drop(s);
                }
                Err(_) => {
                    errored += 1;
                    v.set_read_fail_after(None);
                    v.set_read_fail_once_after(None);
                }
            }
            let s = Store::open_with(SIM_PATH, o).map_err(|e| format!("{label}: reopen: {e}"))?;
            if pass(&s).map_err(|e| format!("{label}, reopened: {e}"))? != 0 {
                return Err(format!("{label}: errors after reopening without faults"));
            }
            verify_clean(&s, &label)?;
        }
        if errored == 0 {
            return Err("no read fault ever surfaced as an error".into());
        }
        Ok(())
    });
}

/// A served volume's kind of workload (4 KiB block writes, acknowledged without a
/// sync, a flush every 16, a checkpoint every 64) with a persistent fault armed at
/// each of a sample of its I/O operations: while the store lives, poisoned or not,
/// every block reads back its last acknowledged write, or a write made after it
/// that failed, or the read fails; never an older write, never zeroes for a block
/// written. (A reviewer's NBD checker saw blocks of a poisoned server read back
/// their last flushed contents.)
#[test]
fn a_volume_reads_back_every_acknowledged_write_after_a_fault() {
    use cambium::volume::Volume;
    use std::collections::HashMap;

    const BLOCKS: u64 = 256;
    const WRITES: u64 = 400;
    // Returns how many writes failed.
    let workload = |vfs: &SimVfs, seed: u64| -> Result<u64, String> {
        let store = create_sim(vfs);
        let vol = Volume::create(&store, "v", BLOCKS * 4096, 4096).map_err(|e| e.to_string())?;
        let mut rng = Rng::new(seed);
        // Per block: the last acknowledged write's tag, and the tags of failed writes
        // after it (which may or may not have taken effect).
        let mut acked: HashMap<u64, (u64, Vec<u64>)> = HashMap::new();
        let mut failures = 0;
        let data = |block: u64, tag: u64| -> Vec<u8> {
            let mut d = vec![0u8; 4096];
            d[..8].copy_from_slice(&block.to_le_bytes());
            d[8..16].copy_from_slice(&tag.to_le_bytes());
            d[16..].fill((tag % 251) as u8 + 1);
            d
        };
        for tag in 1..=WRITES {
            let block = rng.below(BLOCKS);
            let ok = vol
                .write_at(block * 4096, &data(block, tag), Durability::Deferred)
                .is_ok();
            let entry = acked.entry(block).or_insert((0, Vec::new()));
            if ok {
                *entry = (tag, Vec::new());
            } else {
                entry.1.push(tag);
                failures += 1;
            }
            if tag % 16 == 0 {
                let _ = vol.sync();
            }
            if tag % 64 == 0 {
                let _ = store.checkpoint();
            }
            // Every block now and then (and at the end); the block written, always.
            let check_all = tag % 32 == 0 || tag == WRITES;
            for (&block, (last, failed)) in acked.iter().filter(|(&b, _)| check_all || b == block) {
                let mut buf = vec![0u8; 4096];
                if vol.read_at(block * 4096, &mut buf).is_err() {
                    continue;
                }
                let got = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                let fine = buf == data(block, got) && (got == *last || failed.contains(&got))
                    || (*last == 0 && buf.iter().all(|&b| b == 0));
                if !fine {
                    return Err(format!(
                        "after write {tag}: block {block} reads tag {got}, last acknowledged \
                         {last}, failed since {failed:?}"
                    ));
                }
            }
        }
        Ok(failures)
    };
    let failed_runs = std::cell::Cell::new(0);
    run_seeds(
        "a_volume_reads_back_every_acknowledged_write_after_a_fault",
        "fault",
        40,
        |seed| {
            let counter = SimVfs::new();
            workload(&counter, seed)?;
            let ops = counter.op_count();
            let at = Rng::new(seed ^ 0x5EED).below(ops);
            let vfs = SimVfs::new();
            vfs.set_fail_after(Some(at));
            let failures = workload(&vfs, seed)
                .map_err(|e| format!("fault at operation {at} of {ops}: {e}"))?;
            failed_runs.set(failed_runs.get() + u64::from(failures > 0));
            Ok(())
        },
    );
    assert!(failed_runs.get() > 0, "no fault ever failed a write");
}
